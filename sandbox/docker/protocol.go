package docker

import (
	"errors"

	"github.com/triadhq/triad/sandbox/jupyter/zmtp"
)

// messageHeadroom is what one kernel message may carry beyond a cell's
// output limit: its header, parent header and metadata frames, and the
// JSON quoting of its content.
const messageHeadroom = 16 << 20

// kernelLimits bound what the host reads from a kernel's sockets, given
// the cell output limit: one message may be as large as a cell's whole
// output plus headroom (80 MiB with the default 64 MiB), so a cell within
// its output limit never trips it, while a kernel cannot make the host
// buffer more than that per socket. A message over it kills the kernel,
// and the cell gets kernel_died with the reason. See docs/DECISIONS.md,
// "Our own ZMTP client".
func kernelLimits(maxOutput int64) zmtp.Limits {
	return zmtp.Limits{MaxMessage: maxOutput + messageHeadroom}
}

// protocolViolation returns why the client gave up on a kernel that broke
// the wire protocol or its bounds ("protocol violation on the shell
// socket: frame of … bytes over the …-byte limit"), or "" when it did not.
// Such a kernel is still running.
func (k *Kernel) protocolViolation() string {
	var v *zmtp.ViolationError
	if k.client != nil && errors.As(k.client.Err(), &v) {
		return v.Error()
	}
	return ""
}

// violated is closed when the client gave up on the kernel for a protocol
// violation, so that died need not wait for an exit that is not coming;
// it is nil (never ready) otherwise.
func (k *Kernel) violated() <-chan struct{} {
	if k.protocolViolation() == "" {
		return nil
	}
	c := make(chan struct{})
	close(c)
	return c
}

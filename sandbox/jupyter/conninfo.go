package jupyter

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
)

// SignatureScheme is the only signature scheme this package speaks.
const SignatureScheme = "hmac-sha256"

// maxUnixPath is the longest unix socket path Linux accepts: sun_path holds
// 108 bytes including the terminating NUL. Longer paths fail with the
// unhelpful "connect: invalid argument", so Dial checks up front.
const maxUnixPath = 107

// ConnInfo is a kernel connection file, field for field as ipykernel reads it
// with `python3 -m ipykernel_launcher -f conn.json`. Marshal it with
// encoding/json.
//
// With the ipc transport, IP is not an address but a path prefix: ipykernel
// binds its sockets at "<IP>-<port>" (for example /run/kernel/k-1).
type ConnInfo struct {
	Transport       string `json:"transport"` // "ipc" or "tcp"
	IP              string `json:"ip"`        // path prefix (ipc) or address (tcp), as the kernel sees it
	ShellPort       int    `json:"shell_port"`
	IOPubPort       int    `json:"iopub_port"`
	StdinPort       int    `json:"stdin_port"`
	ControlPort     int    `json:"control_port"`
	HBPort          int    `json:"hb_port"`
	Key             string `json:"key"`              // HMAC key; its ASCII bytes are the key, not its hex-decoded bytes
	SignatureScheme string `json:"signature_scheme"` // always "hmac-sha256"
	KernelName      string `json:"kernel_name"`
}

// NewConnInfo returns a connection file for the ipc transport whose sockets
// live at ipPrefix-1 … ipPrefix-5 (shell, iopub, stdin, control, hb, the
// order jupyter_client assigns them), signed with a fresh random key.
// ipPrefix is the path as the kernel sees it, e.g. "/run/kernel/k".
func NewConnInfo(ipPrefix string) ConnInfo {
	var b [32]byte
	// crypto/rand.Read never returns an error (Go ≥ 1.24); it aborts the
	// process instead, so there is nothing to handle here.
	_, _ = rand.Read(b[:])
	return ConnInfo{
		Transport:       "ipc",
		IP:              ipPrefix,
		ShellPort:       1,
		IOPubPort:       2,
		StdinPort:       3,
		ControlPort:     4,
		HBPort:          5,
		Key:             hex.EncodeToString(b[:]),
		SignatureScheme: SignatureScheme,
		KernelName:      "python3",
	}
}

// validate reports the first reason info cannot be dialled.
func (info ConnInfo) validate() error {
	switch info.Transport {
	case "ipc", "tcp":
	default:
		return fmt.Errorf("jupyter: transport %q is not supported (want ipc or tcp)", info.Transport)
	}
	if info.SignatureScheme != SignatureScheme && !(info.SignatureScheme == "" && info.Key == "") {
		return fmt.Errorf("jupyter: signature scheme %q is not supported (want %s)", info.SignatureScheme, SignatureScheme)
	}
	for _, p := range []struct {
		name string
		port int
	}{{"shell", info.ShellPort}, {"iopub", info.IOPubPort}, {"control", info.ControlPort}, {"hb", info.HBPort}} {
		if p.port <= 0 || p.port > 65535 {
			return fmt.Errorf("jupyter: %s_port %d is out of range", p.name, p.port)
		}
	}
	return nil
}

// endpoint is one socket's address as the Go side dials it.
type endpoint struct {
	network string // "unix" or "tcp"
	addr    string // path or host:port
}

// endpoint returns where the socket on port lives from the host's point of
// view. host replaces info.IP when set: with ipc it is the host path prefix
// of the bind-mounted socket directory, with tcp a host address.
func (info ConnInfo) endpoint(host string, port int) (endpoint, error) {
	if host == "" {
		host = info.IP
	}
	switch info.Transport {
	case "ipc":
		path := host + "-" + strconv.Itoa(port)
		if len(path) > maxUnixPath {
			return endpoint{}, fmt.Errorf("jupyter: socket path %q is %d bytes, over the %d-byte unix socket limit; use a shorter directory", path, len(path), maxUnixPath)
		}
		return endpoint{network: "unix", addr: path}, nil
	default:
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		return endpoint{network: "tcp", addr: addr}, nil
	}
}

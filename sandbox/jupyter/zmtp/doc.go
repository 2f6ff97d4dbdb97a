// Package zmtp speaks the part of ZMTP 3.0 (rfc.zeromq.org 23/ZMTP, with
// the framing 37/ZMTP keeps) that a Jupyter client needs, and reads every
// byte from its peer within fixed bounds.
//
// It covers the NULL security mechanism, the DEALER, SUB and REQ socket
// types over one connection each (the client end of a kernel's shell,
// control, iopub and heartbeat sockets), the greeting, the READY command
// with Socket-Type and Identity, short and long frames, the MORE flag and
// multipart messages. PING is answered with PONG; other commands between
// messages are ignored. A SUB connection subscribes with a ZMTP 3.0
// subscription message, which ZMTP 3.1 peers still accept from a 3.0 peer.
//
// The peer is not trusted: a cell running in the kernel can write raw bytes
// to the kernel's end of each connection. So every frame's size, every
// message's total size and its frame count are checked against Limits
// before anything is allocated, and once a message has begun its bytes must
// keep coming (Limits.Stall). A breach is a *ViolationError and ends the
// connection; it never panics and never allocates past the bound. See
// docs/DECISIONS.md, "Our own ZMTP client".
//
// Reconnection, queueing, routing and socket types other than the three
// above are deliberately absent: a Jupyter client treats a lost connection
// as a dead kernel.
package zmtp

package jupyter

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"time"

	"github.com/google/uuid"
)

// ProtocolVersion is the Jupyter messaging protocol version this client
// speaks and puts in every header it sends.
const ProtocolVersion = "5.3"

// delimiter separates routing identities from the signed message parts.
var delimiter = []byte("<IDS|MSG>")

// errBadSignature marks a message whose HMAC does not match; such messages
// are dropped, never delivered.
var errBadSignature = errors.New("jupyter: bad message signature")

// header is a message header as the messaging spec defines it. The parent
// header of a message the kernel sends unprompted (status: starting) is {}.
type header struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

// message is one decoded Jupyter message. Content stays raw until the
// handler that wants it decodes it into the type it expects.
type message struct {
	Header   header
	Parent   header
	Metadata json.RawMessage
	Content  json.RawMessage
	Buffers  [][]byte
}

// signer computes and checks message signatures. The key is the ASCII bytes
// of the connection file's hex key (pitfall 1 of jupyter-over-zmq.md): the
// hex is not decoded. An empty key disables signing, as in jupyter_client.
type signer struct {
	key []byte
}

// sign returns the lowercase hex HMAC-SHA256 over the four signed parts,
// or "" when signing is disabled.
func (s signer) sign(parts [4][]byte) []byte {
	if len(s.key) == 0 {
		return []byte{}
	}
	return []byte(hex.EncodeToString(s.mac(parts)))
}

func (s signer) mac(parts [4][]byte) []byte {
	var h hash.Hash = hmac.New(sha256.New, s.key)
	for _, p := range parts {
		h.Write(p)
	}
	return h.Sum(nil)
}

// verify reports whether sig is the signature of parts, in constant time.
func (s signer) verify(sig []byte, parts [4][]byte) bool {
	if len(s.key) == 0 {
		return true
	}
	got := make([]byte, hex.DecodedLen(len(sig)))
	if _, err := hex.Decode(got, sig); err != nil {
		return false
	}
	return hmac.Equal(got, s.mac(parts))
}

// session builds outgoing messages for one client session.
type session struct {
	id       string
	username string
	signer   signer
}

// newHeader returns a header for a new message of type msgType.
func (s *session) newHeader(msgType string) header {
	return header{
		MsgID:    uuid.NewString(),
		Session:  s.id,
		Username: s.username,
		// ISO 8601 with microseconds, as jupyter_client writes it.
		Date:    time.Now().UTC().Format("2006-01-02T15:04:05.000000Z07:00"),
		MsgType: msgType,
		Version: ProtocolVersion,
	}
}

// encode returns the frames of a request: no routing identities (DEALER
// sockets add none), the delimiter, the signature, then the four signed
// parts. The parent header and metadata of a request are empty objects.
func (s *session) encode(h header, content any) ([][]byte, error) {
	hb, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("jupyter: encode header: %w", err)
	}
	cb, err := json.Marshal(content)
	if err != nil {
		return nil, fmt.Errorf("jupyter: encode %s content: %w", h.MsgType, err)
	}
	parts := [4][]byte{hb, []byte("{}"), []byte("{}"), cb}
	return [][]byte{delimiter, s.signer.sign(parts), parts[0], parts[1], parts[2], parts[3]}, nil
}

// decode parses frames received on any channel: zero or more identities or
// a pub/sub topic, the delimiter, the signature, the four signed parts and
// optional buffers. It checks the signature before parsing anything, so a
// forged message never reaches JSON decoding.
func (s *session) decode(frames [][]byte) (message, error) {
	i := 0
	for i < len(frames) && !bytes.Equal(frames[i], delimiter) {
		i++
	}
	if len(frames)-i < 6 {
		return message{}, fmt.Errorf("jupyter: malformed message: %d frames, delimiter at %d", len(frames), i)
	}
	sig := frames[i+1]
	parts := [4][]byte{frames[i+2], frames[i+3], frames[i+4], frames[i+5]}
	if !s.signer.verify(sig, parts) {
		return message{}, errBadSignature
	}
	var m message
	if err := json.Unmarshal(parts[0], &m.Header); err != nil {
		return message{}, fmt.Errorf("jupyter: decode header: %w", err)
	}
	if err := json.Unmarshal(parts[1], &m.Parent); err != nil {
		return message{}, fmt.Errorf("jupyter: decode parent header of %s: %w", m.Header.MsgType, err)
	}
	m.Metadata = parts[2]
	m.Content = parts[3]
	m.Buffers = frames[i+6:]
	return m, nil
}

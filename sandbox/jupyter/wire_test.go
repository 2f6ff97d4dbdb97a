package jupyter

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestSignMatchesJupyterClient pins the signature to the one Debian's
// jupyter_client computes for the same parts, key and scheme:
//
//	Session(key=b"0123456789abcdef0123456789abcdef", signature_scheme="hmac-sha256").sign(parts)
//
// The key is used as its ASCII bytes, not hex-decoded.
func TestSignMatchesJupyterClient(t *testing.T) {
	s := signer{key: []byte("0123456789abcdef0123456789abcdef")}
	parts := [4][]byte{[]byte(`{"msg_id":"a"}`), []byte(`{}`), []byte(`{}`), []byte(`{"code":"1+1"}`)}
	const want = "e9f00355a4c29ed2c4fe3658f5b14ce53daf48514f8c4699dce286a3c862ce3e"
	if got := string(s.sign(parts)); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// TestDecode checks framing and signature checks on received messages.
func TestDecode(t *testing.T) {
	sess := &session{id: "s", username: "u", signer: signer{key: []byte("k3y")}}
	h := sess.newHeader("execute_request")
	frames, err := sess.encode(h, map[string]string{"code": "1+1"})
	if err != nil {
		t.Fatal(err)
	}
	tampered := slices.Clone(frames)
	tampered[5] = []byte(`{"code":"2+2"}`)
	badHex := slices.Clone(frames)
	badHex[1] = []byte("zz")
	for _, tc := range []struct {
		name    string
		frames  [][]byte
		wantErr error // nil: decodes; errBadSignature; or any error (errAny)
	}{
		{"as sent", frames, nil},
		{"with a router identity", append([][]byte{[]byte("id")}, frames...), nil},
		{"with a pub topic", append([][]byte{[]byte("stream.stdout")}, frames...), nil},
		{"with buffers", append(slices.Clone(frames), []byte("buf")), nil},
		{"tampered content", tampered, errBadSignature},
		{"signature not hex", badHex, errBadSignature},
		{"no delimiter", frames[1:], errAny},
		{"truncated", frames[:5], errAny},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := sess.decode(tc.frames)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("got %v, want success", err)
			case tc.wantErr == errAny && err == nil, tc.wantErr == errBadSignature && !errors.Is(err, errBadSignature):
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			case tc.wantErr != nil:
				return
			}
			if diff := cmp.Diff(h, m.Header); diff != "" {
				t.Errorf("header (-want +got):\n%s", diff)
			}
			if string(m.Content) != `{"code":"1+1"}` {
				t.Errorf("got content %s, want %s", m.Content, `{"code":"1+1"}`)
			}
		})
	}
}

// errAny stands for "some error" in TestDecode.
var errAny = errors.New("any error")

// TestConnInfoJSON checks the field names ipykernel reads.
func TestConnInfoJSON(t *testing.T) {
	info := NewConnInfo("/run/kernel/k")
	b, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"transport": "ipc", "ip": "/run/kernel/k",
		"shell_port": 1.0, "iopub_port": 2.0, "stdin_port": 3.0, "control_port": 4.0, "hb_port": 5.0,
		"key": info.Key, "signature_scheme": "hmac-sha256", "kernel_name": "python3",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("conn.json (-want +got):\n%s", diff)
	}
	if len(info.Key) != 64 || NewConnInfo("/x").Key == info.Key {
		t.Errorf("got key %q, want 64 random hex characters", info.Key)
	}
}

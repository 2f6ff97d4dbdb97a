package wire

import (
	"time"

	"github.com/triadhq/triad/tmpfs"
)

// FileRef is a run file's content address: the one file reference every
// answer uses (tmp.write, files_out, images in exec answers, artifacts,
// trace outputs).
type FileRef struct {
	Path   string       `json:"path"`
	Size   int64        `json:"size"`
	SHA256 tmpfs.Digest `json:"sha256"`
}

// Ref returns f's reference.
func Ref(f tmpfs.File) FileRef { return FileRef{Path: f.Path, Size: f.Size, SHA256: f.SHA256} }

// Refs returns the references of fs, never nil.
func Refs(fs []tmpfs.File) []FileRef {
	out := make([]FileRef, 0, len(fs))
	for _, f := range fs {
		out = append(out, Ref(f))
	}
	return out
}

// FileInfo is one entry of tmp.list: a reference and when it last changed.
type FileInfo struct {
	FileRef
	ModifiedAt time.Time `json:"modified_at"`
}

// Info returns f's listing entry.
func Info(f tmpfs.File) FileInfo { return FileInfo{FileRef: Ref(f), ModifiedAt: f.ModifiedAt} }

// WriteRequest is tmp.write's input: a path and exactly one of Text and
// BytesB64. Its answer is a FileRef.
type WriteRequest struct {
	Path     string  `json:"path"`
	Text     *string `json:"text,omitempty"`
	BytesB64 *string `json:"bytes_b64,omitempty"`
}

// ReadResponse is tmp.read's answer: Text when the bytes are valid UTF-8,
// otherwise BytesB64.
type ReadResponse struct {
	FileRef
	Text     *string `json:"text,omitempty"`
	BytesB64 *string `json:"bytes_b64,omitempty"`
}

// ListResponse is tmp.list's answer.
type ListResponse struct {
	Files []FileInfo `json:"files"`
}

// PathRequest names one run path (tmp.delete, tmp.read).
type PathRequest struct {
	Path string `json:"path"`
}

// OK is the answer of calls that only succeed or fail (tmp.delete,
// cel.note, cel.finalize).
type OK struct {
	OK bool `json:"ok"`
}

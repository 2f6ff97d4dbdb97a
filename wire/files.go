package wire

import (
	"time"

	"github.com/triadhq/triad/tmpfs"
)

// FileRef is a run file's content address: the one file reference every
// answer uses (tmp.write, files_out, images in exec answers, artifacts,
// trace outputs).
type FileRef struct {
	Path   string       `json:"path" doc:"The run path."`
	Size   int64        `json:"size" doc:"Size in bytes."`
	SHA256 tmpfs.Digest `json:"sha256" doc:"sha256 of the content."`
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
	ModifiedAt time.Time `json:"modified_at" doc:"When the file last changed."`
}

// Info returns f's listing entry.
func Info(f tmpfs.File) FileInfo { return FileInfo{FileRef: Ref(f), ModifiedAt: f.ModifiedAt} }

// WriteRequest is tmp.write's input: a path and exactly one of Text and
// BytesB64. Its answer is a FileRef.
type WriteRequest struct {
	Path     string  `json:"path" format:"run-path" doc:"Relative path in the run, e.g. data/leads.csv. CEL.md and the journal's records are reserved."`
	Text     *string `json:"text,omitempty" doc:"The content as UTF-8 text."`
	BytesB64 *string `json:"bytes_b64,omitempty" pattern:"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$" doc:"The content as standard base64 (RFC 4648, padded), for binary files."`
}

// ExactlyOne implements wire.ExactlyOne: the content is text or bytes.
func (WriteRequest) ExactlyOne() []string { return []string{"text", "bytes_b64"} }

// ReadResponse is tmp.read's answer: Text when the bytes are valid UTF-8,
// otherwise BytesB64.
type ReadResponse struct {
	FileRef
	Text     *string `json:"text,omitempty" doc:"The content, when it is valid UTF-8."`
	BytesB64 *string `json:"bytes_b64,omitempty" doc:"The content as standard base64, when it is not UTF-8."`
}

// ListResponse is tmp.list's answer.
type ListResponse struct {
	Files []FileInfo `json:"files" doc:"The files, sorted by path."`
}

// PathRequest names one run path (tmp.delete, tmp.read).
type PathRequest struct {
	Path string `json:"path" format:"run-path" doc:"Relative path in the run."`
}

// ListRequest is tmp.list's input (the query of GET /tmp/list).
type ListRequest struct {
	Prefix string `json:"prefix,omitempty" format:"run-prefix" doc:"A directory prefix such as artifacts/; absent or empty lists every file."`
}

// OK is the answer of calls that only succeed or fail (tmp.delete,
// cel.note, cel.finalize).
type OK struct {
	OK bool `json:"ok" doc:"True: the call did what it was asked."`
}

package e2b

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// File metadata: files.write(…, {metadata}) sends X-Metadata-<key>: <value>
// headers (envd 0.6.2), and getInfo, list, write and rename show the
// metadata back. envd keeps it in the file's extended attributes; Triad's
// run files are content-addressed blobs with none, so the sandbox's record
// keeps it, per path, bound to the bytes it was set with: a file whose bytes
// changed since (a cell, a command or tmp.write rewrote it) has no metadata
// any more, as a file envd replaced has new attributes. See
// docs/DECISIONS.md, "E2B surface: file metadata".

// metadataHeader prefixes the SDK's file metadata headers.
const metadataHeader = "X-Metadata-"

// maxFileMeta bounds the metadata a sandbox keeps, keys and values of all
// its files together: the record that holds it is rewritten whole.
const maxFileMeta = 256 << 10

// fileMeta is the metadata set on one run file.
type fileMeta struct {
	// SHA256 is the file's content when its metadata was set.
	SHA256 tmpfs.Digest      `json:"sha256"`
	Meta   map[string]string `json:"meta"`
}

// parseMetadata reads a write's metadata from its headers as envd does:
// keys lowercased, the first value of a repeated header, an empty key
// dropped. A key that is not an HTTP token or a value that is not printable
// ASCII is refused, as the SDK refuses them.
func parseMetadata(h http.Header) (map[string]string, error) {
	var out map[string]string
	for k, vs := range h {
		if len(k) < len(metadataHeader) || !strings.EqualFold(k[:len(metadataHeader)], metadataHeader) || len(vs) == 0 {
			continue
		}
		key := strings.ToLower(k[len(metadataHeader):])
		if key == "" {
			continue
		}
		if !isToken(key) {
			return nil, fault.Badf("metadata keys use letters, digits and !#$%&'*+-.^_`|~ only", "metadata key %q is not valid", key)
		}
		for _, c := range vs[0] {
			if c < 0x20 || c > 0x7e {
				return nil, fault.Badf("metadata values are printable US-ASCII", "the value of metadata key %q is not printable ASCII", key)
			}
		}
		if out == nil {
			out = map[string]string{}
		}
		out[key] = vs[0]
	}
	return out, nil
}

func isToken(s string) bool {
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.ContainsRune("!#$%&'*+-.^_`|~", c):
		default:
			return false
		}
	}
	return s != ""
}

// metaOf is the metadata of the run file f: what was set at its path, if
// the file still has the bytes it was set with.
func (sb Sandbox) metaOf(f wire.FileInfo) map[string]string { return sb.metaAt(f.Path, f.SHA256) }

// metaAt is the metadata set at path, if it was set on these bytes.
func (sb Sandbox) metaAt(path string, sha tmpfs.Digest) map[string]string {
	m, ok := sb.FileMeta[path]
	if !ok || m.SHA256 != sha {
		return nil
	}
	return maps.Clone(m.Meta)
}

func metaSize(all map[string]fileMeta) int {
	n := 0
	for p, m := range all {
		n += len(p) + 64
		for k, v := range m.Meta {
			n += len(k) + len(v)
		}
	}
	return n
}

// setMeta records the metadata a write set on the file at path (ref); a
// write without metadata clears what the path had, as envd's new file has
// no attributes. The file is written already: a sandbox whose metadata is
// full gets a 429 that says the file was stored without it.
func (s *Server) setMeta(ctx context.Context, id runid.ID, ref wire.FileRef, meta map[string]string) error {
	_, err := s.reg.update(ctx, id, func(sb *Sandbox) error {
		if len(meta) == 0 {
			if _, ok := sb.FileMeta[ref.Path]; !ok {
				return errUnchanged
			}
			delete(sb.FileMeta, ref.Path)
			return nil
		}
		if sb.FileMeta == nil {
			sb.FileMeta = map[string]fileMeta{}
		}
		sb.FileMeta[ref.Path] = fileMeta{SHA256: ref.SHA256, Meta: meta}
		if metaSize(sb.FileMeta) > maxFileMeta {
			return fault.New(fault.Quota, fmt.Sprintf("%s was stored without its metadata: the sandbox keeps at most %d bytes of file metadata", sdkPath(ref.Path), maxFileMeta),
				"write files without metadata, or remove files whose metadata you no longer need")
		}
		return nil
	})
	return metaErr(err)
}

// moveMeta carries metadata along with files moved from src to dst, and
// drops what the destinations had.
func (s *Server) moveMeta(ctx context.Context, id runid.ID, moves [][2]string) error {
	_, err := s.reg.update(ctx, id, func(sb *Sandbox) error {
		changed := false
		for _, m := range moves {
			old, had := sb.FileMeta[m[0]]
			_, over := sb.FileMeta[m[1]]
			if !had && !over {
				continue
			}
			changed = true
			delete(sb.FileMeta, m[0])
			delete(sb.FileMeta, m[1])
			if had {
				sb.FileMeta[m[1]] = old
			}
		}
		if !changed {
			return errUnchanged
		}
		return nil
	})
	return metaErr(err)
}

// dropMeta forgets the metadata of removed files.
func (s *Server) dropMeta(ctx context.Context, id runid.ID, paths []string) error {
	_, err := s.reg.update(ctx, id, func(sb *Sandbox) error {
		n := len(sb.FileMeta)
		for _, p := range paths {
			delete(sb.FileMeta, p)
		}
		if len(sb.FileMeta) == n {
			return errUnchanged
		}
		return nil
	})
	return metaErr(err)
}

// errUnchanged skips a record update that would write nothing new.
var errUnchanged = fault.New(fault.Internal, "unchanged", "")

func metaErr(err error) error {
	switch {
	case err == nil, err == errUnchanged:
		return nil
	case fault.As(err) != nil:
		return err
	}
	return fault.Wrap(fault.StoreUnavailable, err, "the file's metadata could not be recorded", "retry the call; GET /healthz shows the store's state")
}

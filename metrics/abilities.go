package metrics

import (
	"os"

	"github.com/triadhq/triad/tmpfs"
)

// The store wrappers keep the wrapped store's optional abilities
// reachable: a blob's fingerprint and file (verified-once reads and
// sendfile, tmpfs.Fingerprinted and tmpfs.Filer) through the counted
// blob, and fsck's (tmpfs.Scrubbable, tmpfs.RunLister) through Unwrap.

// Unwrap returns the wrapped blobs.
func (b *blobs) Unwrap() tmpfs.Blobs { return b.b }

// Unwrap returns the wrapped index.
func (x *index) Unwrap() tmpfs.Index { return x.x }

// Verified implements tmpfs.Fingerprinted; a blob without fingerprints is
// never verified unread.
func (c *countedBlob) Verified() bool {
	f, ok := c.Blob.(tmpfs.Fingerprinted)
	return ok && f.Verified()
}

// MarkVerified implements tmpfs.Fingerprinted.
func (c *countedBlob) MarkVerified() error {
	if f, ok := c.Blob.(tmpfs.Fingerprinted); ok {
		return f.MarkVerified()
	}
	return nil
}

// File implements tmpfs.Filer. Bytes served from the file bypass Read, so
// the blob's whole size is counted when the file is handed out.
func (c *countedBlob) File() *os.File {
	f, ok := c.Blob.(tmpfs.Filer)
	if !ok {
		return nil
	}
	file := f.File()
	if file != nil {
		c.c.Add(float64(c.Blob.Size()))
	}
	return file
}

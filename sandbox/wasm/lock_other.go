//go:build !unix

package wasm

import "os"

// lockWorkRoot has no portable lock to take here; without one, New must not
// remove leftovers, so it reports nil and the caller skips the sweep.
func lockWorkRoot(root string) (*os.File, error) { return nil, nil }

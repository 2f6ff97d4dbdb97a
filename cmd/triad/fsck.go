package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/triadhq/triad/tmpfs"
)

const fsckUsage = `Usage:
  triad fsck [--dry-run] [--rate BYTES] [--json] [store flags]

Re-hashes every blob in the store (--store and its flags, or their TRIAD_*
twins), whatever its fingerprint says, every version of an appended file
(CEL.md, trace.jsonl) included, and quarantines each one whose bytes no
longer match their sha256: it is moved aside (quarantine/ beside blobs/,
on disk or in the bucket), never served again, and listed with the runs and
paths that referenced it. Writing a file's true bytes again restores it.
Leftovers of crashed writes older than a day are removed. The exit status is
1 when a blob failed or could not be read.

It may run beside a server on the same store; triad serve --scrub-rate does
the same in the background, slowly.
`

// fsckCmd is "triad fsck": it works on the store directly, like triad keys.
func fsckCmd(ctx context.Context, args []string) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Print(fsckUsage)
		return nil
	}
	var c config
	fs := newFlagSet("fsck")
	var dry, asJSON bool
	var rate string
	fs.BoolVar(&dry, "dry-run", false, "report bad blobs without moving them")
	fs.StringVar(&rate, "rate", "0", "hash at most this many bytes a second, like 50MiB; 0 reads as fast as the store answers")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	c.common(fs)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	var bps int64
	if rate != "0" {
		var err error
		if bps, err = parseBytes(rate); err != nil {
			return fmt.Errorf("--rate: %w", err)
		}
	}
	log := newLogger(&c)
	store, closeStore, err := openStore(ctx, &c, log)
	if err != nil {
		return err
	}
	defer closeStore()
	rep, err := store.Fsck(ctx, tmpfs.FsckOptions{Rate: bps, DryRun: dry})
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if rep.Bad == nil {
			rep.Bad = []tmpfs.Bad{}
		}
		enc.Encode(rep)
	} else {
		for _, b := range rep.Bad {
			state := "quarantined"
			if !b.Quarantined {
				state = "NOT moved"
			}
			fmt.Printf("BAD %s (%d bytes): %s; %s\n", b.SHA256, b.Size, b.Reason, state)
			if len(b.Refs) == 0 {
				fmt.Println("    referenced by no run")
			}
			for _, r := range b.Refs {
				fmt.Printf("    run %s path %s\n", r.Run, r.Path)
			}
		}
		for _, u := range rep.Unreadable {
			fmt.Printf("UNREADABLE %s\n", u)
		}
		fmt.Printf("checked %d blobs (%d bytes): %d bad, %d unreadable; removed %d leftovers of crashed writes\n",
			rep.Blobs, rep.Bytes, len(rep.Bad), len(rep.Unreadable), rep.Swept)
	}
	if err != nil {
		return fmt.Errorf("fsck: %w", err)
	}
	if n := len(rep.Bad) + len(rep.Unreadable); n > 0 {
		return fmt.Errorf("fsck: %d blob(s) failed verification or could not be read", n)
	}
	return nil
}

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
)

const gcUsage = `Usage:
  triad gc [--grace DURATION] [store flags]

Removes the blobs no run's index names that were stored (or found again by
a write) longer than --grace ago: the collection triad serve runs every
--gc-every. A deleted run's blobs go this way once no other run, of any
tenant, holds the same bytes. It may run beside a server on the same store;
the grace period is what keeps a blob that a write there has just found and
is about to link (see docs/DECISIONS.md, "Deleting runs and collecting
blobs").
`

// gcCmd is "triad gc": a collection of the store, like triad fsck.
func gcCmd(ctx context.Context, args []string) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Print(gcUsage)
		return nil
	}
	var c config
	fs := newFlagSet("gc")
	var grace time.Duration
	fs.DurationVar(&grace, "grace", orchestrator.DefaultGrace, "keep blobs stored or found again more recently than this (at least 10m)")
	c.common(fs)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if grace < 10*tmpfs.FreshenAge {
		return fmt.Errorf("--grace %s: want at least %s", grace, 10*tmpfs.FreshenAge)
	}
	log := newLogger(&c)
	store, closeStore, err := openStore(ctx, &c, log)
	if err != nil {
		return err
	}
	defer closeStore()
	rep, err := store.Collect(ctx, tmpfs.CollectOptions{Before: time.Now().Add(-grace)})
	if err != nil {
		return err
	}
	fmt.Printf("%d blobs stored, %d held by runs, %d removed (%d bytes), %d leftovers tidied\n", rep.Stored, rep.Live, rep.Removed, rep.Bytes, rep.Tidied)
	return nil
}

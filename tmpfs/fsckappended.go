package tmpfs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"time"
)

// AppendScrubbable is the optional ability of a Blobs that stores appended
// blobs (Appender) apart from the ones Walk lists: Fsck checks them through
// it. Versions of an appended file share their leading bytes, so the store
// hands them over in groups, and Fsck reads a group's bytes once rather
// than once per version: checking every version of a journal costs its
// size, not its size times its steps.
type AppendScrubbable interface {
	// WalkAppended calls fn for each group of appended blobs, in no set
	// order, until fn returns an error (which WalkAppended returns) or
	// the groups run out.
	WalkAppended(ctx context.Context, fn func(g AppendedGroup) error) error
	// QuarantineAppended moves appended blob d aside, with report (JSON)
	// kept beside it, so that later opens of d fail with ErrQuarantined
	// until its true bytes are written again. An appended blob's bytes
	// never change once written, so there is no version to match.
	QuarantineAppended(ctx context.Context, d Digest, report []byte) error
}

// AppendedGroup is a set of appended blobs that begin with the same bytes.
type AppendedGroup struct {
	// Base, unless zero, is a blob of BaseSize bytes that every member's
	// bytes begin with. Walk lists it, and Fsck checks it there too; here
	// it is hashed (once per pass) as the members' start.
	Base     Digest
	BaseSize int64
	// Members are the group's blobs, in ascending Size.
	Members []AppendedBlob
	// Nested reports that each member's bytes are a prefix of the next
	// one's, so one read of the last member checks them all.
	Nested bool
	// Open opens the bytes of member m that follow the base. A reader of
	// a nested group's last member serves every member.
	Open func(ctx context.Context, m AppendedBlob) (io.ReadCloser, error)
}

// AppendedBlob is one member of an AppendedGroup.
type AppendedBlob struct {
	Digest Digest
	// Size is the whole blob's, base included.
	Size int64
	// State, if set, is the sha256 midstate the store keeps after the
	// blob's bytes, from which later appends continue: a damaged one
	// would give every later version a wrong digest, so it is checked
	// too.
	State []byte
	// Damaged, if set, says why the store cannot even locate the blob's
	// bytes (its record does not parse): the blob is bad without a read.
	Damaged string
}

// fsck is one pass of Store.Fsck.
type fsck struct {
	s    *Store
	opts FsckOptions
	rep  *FsckReport
	p    *pacer
	refs map[Digest][]Ref
	// bases holds what this pass found of each group base, so a base
	// shared by many groups is read once.
	bases map[Digest]baseCheck
	buf   []byte // for hashing appended blobs
}

// unreadable records a blob that could not be read to its end.
func (f *fsck) unreadable(ctx context.Context, d Digest, err error) {
	f.s.log.ErrorContext(ctx, "fsck: could not read a blob", "sha256", d.String(), "err", err)
	f.rep.Unreadable = append(f.rep.Unreadable, fmt.Sprintf("%s: %v", d, err))
}

// bad records a blob whose bytes failed their check, with the runs and
// paths that point at it, and moves it aside with quarantine (not in a dry
// run).
func (f *fsck) bad(ctx context.Context, d Digest, size int64, reason string, quarantine func(report []byte) error) error {
	if f.refs == nil {
		var err error
		if f.refs, err = f.s.refs(ctx); err != nil {
			f.s.log.ErrorContext(ctx, "fsck: could not list the runs that reference a bad blob", "err", err)
			f.refs = map[Digest][]Ref{}
		}
	}
	bad := Bad{SHA256: d, Size: size, Reason: reason, Refs: f.refs[d], FoundAt: time.Now().UTC()}
	if bad.Refs == nil {
		bad.Refs = []Ref{}
	}
	if !f.opts.DryRun {
		report, _ := json.MarshalIndent(bad, "", "  ")
		switch err := quarantine(report); {
		case err == nil:
			bad.Quarantined = true
			f.s.forget(d)
		case errors.Is(err, ErrPrecondition):
			bad.Reason += "; a new copy replaced it while it was checked, and was left in place"
		case errors.Is(err, ErrNotFound), errors.Is(err, ErrQuarantined):
			bad.Reason += "; it was deleted or moved aside while it was checked"
		default:
			return fmt.Errorf("quarantine blob %s: %w", d, err)
		}
	}
	f.s.log.ErrorContext(ctx, "blob failed verification", "sha256", d.String(), "size", size, "quarantined", bad.Quarantined, "refs", len(bad.Refs))
	f.rep.Bad = append(f.rep.Bad, bad)
	if f.opts.OnBad != nil {
		f.opts.OnBad(bad)
	}
	return nil
}

// group checks an AppendedGroup's members: the base's midstate, then
// each member's bytes after it, compared with the member's digest and
// stored midstate at the member's end.
func (f *fsck) group(ctx context.Context, as AppendScrubbable, g AppendedGroup) error {
	base, err := f.base(ctx, g)
	if err != nil {
		return err
	}
	st := stream{ended: -1}
	defer st.close()
	for _, m := range g.Members {
		if err := ctx.Err(); err != nil {
			return err
		}
		var why string
		switch {
		case m.Damaged != "":
			why = m.Damaged
		case base.bad != "":
			why = base.bad
		case base.skip:
			continue // the base is gone or unreadable: reported once
		case st.ended >= 0 && m.Size > st.ended:
			why = fmt.Sprintf(endedEarly, st.ended, m.Size)
		default:
			var checked bool
			if why, checked, err = f.read(ctx, g, base.state, &st, m); err != nil {
				return err
			} else if !checked {
				continue
			}
		}
		f.rep.Blobs++
		if why == "" {
			continue
		}
		err := f.bad(ctx, m.Digest, m.Size, why, func(report []byte) error { return as.QuarantineAppended(ctx, m.Digest, report) })
		if err != nil {
			return err
		}
	}
	return nil
}

const endedEarly = "stored bytes end after %d of its %d bytes"

// stream is where a group's read stands: the open bytes, the hash of the
// first pos of them, and where a nested group's bytes ended early (-1:
// they did not).
type stream struct {
	r     io.ReadCloser
	h     hash.Hash
	pos   int64
	ended int64
}

func (s *stream) close() {
	if s.r != nil {
		s.r.Close()
		s.r = nil
	}
}

// read hashes member m's bytes into st and says why m is bad ("" when it
// is good). It opens the group's bytes when it must: for each member of a
// flat group, once (the last member's) for a nested one. checked is false
// when m is gone or could not be read (which is reported).
func (f *fsck) read(ctx context.Context, g AppendedGroup, state []byte, st *stream, m AppendedBlob) (why string, checked bool, err error) {
	if st.r == nil || !g.Nested {
		st.close()
		open := m
		if g.Nested {
			open = g.Members[len(g.Members)-1]
		}
		rc, err := g.Open(ctx, open)
		switch {
		case errors.Is(err, ErrNotFound), errors.Is(err, ErrQuarantined):
			return "", false, nil // deleted or quarantined since the listing
		case errors.Is(err, ErrDigestMismatch):
			return err.Error(), true, nil
		case err != nil:
			if ctx.Err() != nil {
				return "", false, ctx.Err()
			}
			f.unreadable(ctx, m.Digest, err)
			return "", false, nil
		}
		if st.h, err = ResumeHash(state); err != nil {
			rc.Close()
			return "", false, err
		}
		st.r, st.pos = rc, g.BaseSize
	}
	n, err := io.CopyBuffer(st.h, io.LimitReader(f.p.reader(ctx, st.r), m.Size-st.pos), f.buf)
	st.pos += n
	f.rep.Bytes += n
	if err != nil {
		st.close()
		if ctx.Err() != nil {
			return "", false, ctx.Err()
		}
		f.unreadable(ctx, m.Digest, err)
		return "", false, nil
	}
	if st.pos != m.Size {
		st.close()
		if g.Nested {
			st.ended = st.pos
		}
		return fmt.Sprintf(endedEarly, st.pos, m.Size), true, nil
	}
	if DigestFromHash(st.h) != m.Digest {
		return "stored bytes do not match their sha256", true, nil
	}
	if m.State != nil {
		if s, err := HashState(st.h); err != nil || !bytes.Equal(s, m.State) {
			return "the stored sha256 midstate, from which appends continue, does not match its bytes", true, nil
		}
	}
	return "", true, nil
}

// baseCheck is what a pass found of a group's base.
type baseCheck struct {
	state []byte // the sha256 midstate after the base (nil: no base)
	bad   string // why every member is bad: the base does not match its digest
	skip  bool   // the base is gone or unreadable (reported once): skip the members
}

// base checks g's base, once per pass however many groups share it.
func (f *fsck) base(ctx context.Context, g AppendedGroup) (baseCheck, error) {
	if g.Base.IsZero() {
		return baseCheck{}, nil
	}
	if c, ok := f.bases[g.Base]; ok {
		return c, nil
	}
	c, err := f.hashBase(ctx, g)
	if err != nil {
		return c, err
	}
	if f.bases == nil {
		f.bases = map[Digest]baseCheck{}
	}
	f.bases[g.Base] = c
	return c, nil
}

// hashBase reads and hashes g's base.
func (f *fsck) hashBase(ctx context.Context, g AppendedGroup) (baseCheck, error) {
	bad := baseCheck{bad: fmt.Sprintf("its first %d bytes, blob %s, do not match their sha256", g.BaseSize, g.Base.Short())}
	b, err := f.s.blobs.Open(ctx, g.Base)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return baseCheck{}, ctx.Err()
		case errors.Is(err, ErrDigestMismatch), errors.Is(err, ErrQuarantined):
			return bad, nil
		}
		f.unreadable(ctx, g.Base, fmt.Errorf("the base of appended blobs: %w", err))
		return baseCheck{skip: true}, nil
	}
	defer b.Close()
	h := NewHasher()
	n, err := io.CopyBuffer(h, f.p.reader(ctx, b), f.buf)
	f.rep.Bytes += n
	if err != nil {
		if ctx.Err() != nil {
			return baseCheck{}, ctx.Err()
		}
		f.unreadable(ctx, g.Base, fmt.Errorf("the base of appended blobs: %w", err))
		return baseCheck{skip: true}, nil
	}
	if n != g.BaseSize || DigestFromHash(h) != g.Base {
		return bad, nil
	}
	st, err := HashState(h)
	return baseCheck{state: st}, err
}

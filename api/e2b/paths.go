package e2b

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	fspb "github.com/triadhq/triad/api/e2b/envd/filesystem"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/wire"
)

// Home is where E2B's SDKs expect the user's files: the default user's home
// and the code interpreter's working directory. It maps onto the root of the
// run's files, as does /work, which is where the kernel itself sees them.
const Home = "/home/user"

var roots = []string{Home, "/work"}

// outside reports whether p, as the SDKs send it, names a path of the
// sandbox's own filesystem outside the run's files (an absolute path not
// under Home or /work, such as /tmp/repo), and returns it cleaned. Those
// go to sandbox.fs; the run's files go to the tmp tools. See
// docs/DECISIONS.md, "E2B files outside /home/user".
func outside(p string) (string, bool) {
	if !strings.HasPrefix(p, "/") {
		return "", false
	}
	c := path.Clean(p)
	for _, root := range roots {
		if c == root || strings.HasPrefix(c, root+"/") {
			return "", false
		}
	}
	return c, true
}

// runPath maps a path as the SDKs send it onto a run path: absolute under
// Home (or /work), or relative to Home. "" is the root. Anything else, and
// anything that could leave the run (".."), is refused by the one path
// validator.
func runPath(p string) (string, error) {
	if strings.HasPrefix(p, "/") {
		rel, ok := "", false
		for _, root := range roots {
			if p == root || p == root+"/" {
				return "", nil
			}
			if strings.HasPrefix(p, root+"/") {
				rel, ok = strings.TrimPrefix(p, root+"/"), true
				break
			}
		}
		if !ok {
			return "", fault.Badf(fmt.Sprintf("use a path under %s (the run's files), or one relative to it", Home),
				"path %q is outside the sandbox's files", p)
		}
		p = rel
	}
	if p == "" || p == "." || p == "./" {
		return "", nil
	}
	return safepath.Clean(p)
}

// sdkPath is the absolute path the SDKs show for run path p.
func sdkPath(p string) string {
	if p == "" {
		return Home
	}
	return Home + "/" + p
}

// tree is a run's files seen as a directory tree: the store keeps files,
// and a directory is any prefix of one.
type tree struct {
	root  string // run path of the node the listing was taken at, "" for the root
	files []wire.FileInfo
}

// listTree lists the files at and under run path p with one tmp.list.
func (s *Server) listTree(ctx context.Context, run runid.ID, p string) (tree, error) {
	prefix := p
	out, err := s.c.Core.List(ctx, run, prefix)
	if err != nil {
		return tree{}, err
	}
	t := tree{root: p}
	for _, f := range out.Files {
		// A string prefix also matches "data2/x" for "data": keep the
		// node itself and what is below it.
		if p == "" || f.Path == p || strings.HasPrefix(f.Path, p+"/") {
			t.files = append(t.files, f)
		}
	}
	return t, nil
}

// kind says what the tree's root is: a file, a directory, or nothing.
func (t tree) kind() (file *wire.FileInfo, dir bool) {
	for i, f := range t.files {
		if f.Path == t.root {
			return &t.files[i], false
		}
	}
	return nil, t.root == "" || len(t.files) > 0
}

// below returns the files strictly below the root.
func (t tree) below() []wire.FileInfo {
	var out []wire.FileInfo
	for _, f := range t.files {
		if f.Path != t.root {
			out = append(out, f)
		}
	}
	return out
}

// entries lists the tree's files and directories down to depth levels
// below the root, sorted by path.
func (t tree) entries(depth int, sb Sandbox) []*fspb.EntryInfo {
	dirs := map[string]time.Time{}
	var out []*fspb.EntryInfo
	for _, f := range t.below() {
		rel := f.Path
		if t.root != "" {
			rel = strings.TrimPrefix(f.Path, t.root+"/")
		}
		parts := strings.Split(rel, "/")
		for i := 1; i < len(parts) && i <= depth; i++ {
			d := joinRun(t.root, strings.Join(parts[:i], "/"))
			if f.ModifiedAt.After(dirs[d]) {
				dirs[d] = f.ModifiedAt
			}
		}
		if len(parts) <= depth && !isKeep(f.Path, f.Size) {
			out = append(out, fileEntry(f, sb.metaOf(f)))
		}
	}
	for d, mod := range dirs {
		out = append(out, dirEntry(d, mod))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// dirModTime is the newest modification below the tree's root.
func (t tree) dirModTime() time.Time {
	var m time.Time
	for _, f := range t.files {
		if f.ModifiedAt.After(m) {
			m = f.ModifiedAt
		}
	}
	return m
}

func joinRun(dir, rel string) string {
	if dir == "" {
		return rel
	}
	return dir + "/" + rel
}

// fileEntry describes a run file as envd's EntryInfo. Its metadata is
// only what a caller set with files.write (meta, see filemeta.go), as
// envd's; the content address is Triad's own API's (tmp.list).
func fileEntry(f wire.FileInfo, meta map[string]string) *fspb.EntryInfo {
	return &fspb.EntryInfo{
		Name: path.Base(f.Path), Type: fspb.FileType_FILE_TYPE_FILE, Path: sdkPath(f.Path), Size: f.Size,
		Mode: 0o644, Permissions: "-rw-r--r--", Owner: "user", Group: "user",
		ModifiedTime: timestamppb.New(f.ModifiedAt), Metadata: meta,
	}
}

// isKeep reports whether a file is the empty .keep that files.makeDir
// writes (keepFile): it makes its directory exist, and is not listed or
// watched as a file of its own, so a directory made empty looks empty.
func isKeep(p string, size int64) bool { return size == 0 && path.Base(p) == keepFile }

// dirSize is the size getInfo and list give a directory: Triad's
// directories are the prefixes of its files and have no inode, so they
// report the size of a directory's first block on Linux's filesystems (as
// envd's stat does for a small directory), never 0, which the SDK reads
// as "not a directory".
const dirSize = 4096

func dirEntry(p string, mod time.Time) *fspb.EntryInfo {
	name := path.Base(p)
	if p == "" {
		name = path.Base(Home)
	}
	return &fspb.EntryInfo{
		Name: name, Type: fspb.FileType_FILE_TYPE_DIRECTORY, Path: sdkPath(p), Size: dirSize,
		Mode: 0o755, Permissions: "drwxr-xr-x", Owner: "user", Group: "user",
		ModifiedTime: timestamppb.New(mod),
	}
}

// Package version reports the build's version, set at link time or read from the module's build info.
package version

import "runtime/debug"

// Version is overridden at link time: -ldflags "-X github.com/triadhq/triad/internal/version.Version=v1.2.3".
var Version = ""

// String returns the version: the link-time value, else the module version,
// else "dev" with the VCS revision when the build recorded one.
func String() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return "dev-" + rev
}

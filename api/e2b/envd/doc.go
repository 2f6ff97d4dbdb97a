// Package envd is where the E2B surface's envd services are defined (proto/) and generated from (gen.sh, buf.gen.yaml); the code lives in its sub-packages.
package envd

//go:generate ./gen.sh

package kube

import (
	"regexp"
	"testing"
)

// The file agent walks the working directory from ROOT, which must be
// where the pod mounts it: the image's working directory, not the /work
// symlink that points there (the agent opens ROOT without following
// links, so a symlink is "Not a directory").
func TestAgentRootIsTheWorkMount(t *testing.T) {
	m := regexp.MustCompile(`(?m)^ROOT = "([^"]+)"`).FindSubmatch(agentProgram)
	if m == nil {
		t.Fatal("agent.py sets no ROOT")
	}
	if got := string(m[1]); got != podWork {
		t.Errorf("agent.py's ROOT is %q; the pod mounts the working directory at %q", got, podWork)
	}
}

// Package e2b serves E2B's sandbox API so that agents written against E2B's official SDKs run on Triad unchanged.
//
// An E2B sandbox is a Triad run: its id is the run id, files.* are the run's
// tmp.* files, runCode is sandbox.exec and commands.run runs in the run's
// kernel container. Every call goes through the orchestrator (Core), so it is
// journaled in CEL.md and graded like any other tool call.
//
// Three planes share one listener (see docs/DECISIONS.md, "E2B surface: one
// listener"): the control plane (/sandboxes, /v2/sandboxes; E2B_API_URL), and
// the data plane, told apart by the E2b-Sandbox-Id header that the SDKs send
// to E2B_SANDBOX_URL: envd's REST (/files, /health) and Connect services
// (filesystem.Filesystem, process.Process) on port 49983, and the code
// interpreter (/execute, /contexts) on port 49999. docs/e2b-protocol.md is
// the wire contract, read from the SDKs' source.
package e2b

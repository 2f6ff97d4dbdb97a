// Package kubernetes holds Triad's Kubernetes manifests (the *.yaml files here) and the tests that check them against a real cluster.
//
// The files are applied in name order: the namespaces (both enforcing the
// restricted Pod Security Standard), Triad's ServiceAccount with the Role
// and RoleBinding it needs in the kernels' namespace, a deny-all
// NetworkPolicy there, then the Deployment of triad serve --sandbox kube and
// its Service. scripts/kube.sh applies the first three to the test cluster;
// the tests apply all of them with a server-side dry run and exercise
// admission and RBAC as Triad's own identity. See README.md for deploying.
package kubernetes

package kubernetes_test

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/triadhq/triad/sandbox/image"
	"github.com/triadhq/triad/sandbox/kube"
)

// manifests decodes every object in the *.yaml files here, in the order
// kubectl applies them.
func manifests(t *testing.T) []runtime.Object {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var objs []runtime.Object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := r.Read()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if js, err := utilyaml.ToJSON(doc); err != nil || string(js) == "null" {
				continue // a document of comments only
			}
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			objs = append(objs, obj)
		}
	}
	return objs
}

// only returns the objects of type T.
func only[T runtime.Object](objs []runtime.Object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// TestManifestsAgree checks what a cluster cannot: that the manifests name
// each other consistently, that the Role is exactly the least privilege the
// kube backend needs, and that scripts/kube.sh and the Deployment use the
// same namespaces, identity and sandbox image as the rest.
func TestManifestsAgree(t *testing.T) {
	t.Parallel()
	objs := manifests(t)

	nss := only[*corev1.Namespace](objs)
	if len(nss) != 2 {
		t.Fatalf("got %d namespaces, want 2 (triad and triad-kernels)", len(nss))
	}
	for _, ns := range nss {
		if got := ns.Labels["pod-security.kubernetes.io/enforce"]; got != "restricted" {
			t.Errorf("namespace %s: enforce label %q, want restricted", ns.Name, got)
		}
	}

	roles := only[*rbacv1.Role](objs)
	bindings := only[*rbacv1.RoleBinding](objs)
	policies := only[*networkingv1.NetworkPolicy](objs)
	deploys := only[*appsv1.Deployment](objs)
	services := only[*corev1.Service](objs)
	if len(roles) != 1 || len(bindings) != 1 || len(policies) != 1 || len(deploys) != 1 || len(services) != 1 {
		t.Fatalf("got %d Roles, %d RoleBindings, %d NetworkPolicies, %d Deployments, %d Services; want one each",
			len(roles), len(bindings), len(policies), len(deploys), len(services))
	}
	role, binding, policy, deploy, svc := roles[0], bindings[0], policies[0], deploys[0], services[0]
	kernels := role.Namespace

	wantRules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list", "watch", "delete", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/exec", "pods/attach", "pods/portforward"}, Verbs: []string{"create", "get"}},
		{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create", "get", "list", "watch", "update", "patch", "delete"}},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"create", "get"}},
	}
	if diff := cmp.Diff(wantRules, role.Rules); diff != "" {
		t.Errorf("Role %s/%s rules (-want +got):\n%s", role.Namespace, role.Name, diff)
	}

	var sa *corev1.ServiceAccount
	for _, a := range only[*corev1.ServiceAccount](objs) {
		if a.Namespace != kernels {
			sa = a
		}
	}
	if sa == nil {
		t.Fatal("no ServiceAccount for triad outside the kernels' namespace")
	}
	if binding.Namespace != kernels || binding.RoleRef.Name != role.Name || binding.RoleRef.Kind != "Role" {
		t.Errorf("RoleBinding %s/%s binds %s %s, want Role %s in %s", binding.Namespace, binding.Name, binding.RoleRef.Kind, binding.RoleRef.Name, role.Name, kernels)
	}
	if want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}}; !cmp.Equal(binding.Subjects, want) {
		t.Errorf("RoleBinding subjects: got %+v, want %+v", binding.Subjects, want)
	}

	if policy.Namespace != kernels || len(policy.Spec.PodSelector.MatchLabels)+len(policy.Spec.PodSelector.MatchExpressions) != 0 ||
		len(policy.Spec.Ingress)+len(policy.Spec.Egress) != 0 ||
		!slices.Equal(policy.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
		t.Errorf("NetworkPolicy %s/%s is not deny-all for every pod in %s: %+v", policy.Namespace, policy.Name, kernels, policy.Spec)
	}
	// Triad makes sure a policy of this name exists at startup; the
	// manifest's copy is the same object.
	if policy.Name != kube.NetworkPolicyName {
		t.Errorf("NetworkPolicy name: got %s, want %s, the one Triad creates", policy.Name, kube.NetworkPolicyName)
	}

	if deploy.Namespace != sa.Namespace || deploy.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("Deployment %s/%s runs as %q, want ServiceAccount %s/%s", deploy.Namespace, deploy.Name, deploy.Spec.Template.Spec.ServiceAccountName, sa.Namespace, sa.Name)
	}
	if r := deploy.Spec.Replicas; r == nil || *r != 2 {
		t.Errorf("Deployment replicas: got %v, want 2", r)
	}
	c := deploy.Spec.Template.Spec.Containers[0]
	for _, want := range []string{"serve", "--store=s3", "--sandbox=kube", "--kube-namespace=" + kernels, "--kube-image=" + image.Tag()} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("Deployment args %q lack %q", c.Args, want)
		}
	}
	for _, env := range []string{"TRIAD_S3_ENDPOINT", "TRIAD_S3_BUCKET", "TRIAD_S3_ACCESS_KEY", "TRIAD_S3_SECRET_KEY"} {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == env })
		if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.SecretKeyRef == nil {
			t.Errorf("Deployment: %s does not come from a Secret", env)
		}
	}
	for k, v := range svc.Spec.Selector {
		if deploy.Spec.Template.Labels[k] != v {
			t.Errorf("Service selector %s=%s does not select the Deployment's pods %v", k, v, deploy.Spec.Template.Labels)
		}
	}
	if svc.Namespace != deploy.Namespace {
		t.Errorf("Service in %s, Deployment in %s", svc.Namespace, deploy.Namespace)
	}

	// scripts/kube.sh applies these files and mints a token for this
	// identity; it names them in shell variables.
	script, err := os.ReadFile("../../scripts/kube.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []struct{ name, want string }{{"KERNEL_NS", kernels}, {"TRIAD_NS", sa.Namespace}, {"TRIAD_SA", sa.Name}} {
		m := regexp.MustCompile(`\b` + v.name + `=(\S+)`).FindSubmatch(script)
		if m == nil || string(m[1]) != v.want {
			t.Errorf("scripts/kube.sh: %s=%s, want %s", v.name, m, v.want)
		}
	}
}

// TestManifestsApplyDryRun applies every manifest to the real cluster with a
// server-side dry run: the API server validates each object, defaults it
// and runs admission (Pod Security warns about the Deployment's pod template
// in a namespace labelled warn=restricted), without creating anything.
func TestManifestsApplyDryRun(t *testing.T) {
	c := needCluster(t)
	cmd := exec.CommandContext(t.Context(), c.kubectl, "--kubeconfig", c.adminKubeconfig,
		"apply", "--dry-run=server", "-f", ".")
	out, err := cmd.CombinedOutput()
	t.Logf("kubectl apply --dry-run=server -f deploy/kubernetes/:\n%s", out)
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=server: %v", err)
	}
	// Warnings name deprecated fields and pod templates that Pod Security
	// would refuse. The one about kubectl's annotation is about how the
	// objects were first created, not about the manifests.
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "Warning:") && !strings.Contains(line, "last-applied-configuration") {
			t.Errorf("kubectl warns: %s", line)
		}
	}
	// One "(server dry run)" line per object.
	for _, o := range manifests(t) {
		m, err := meta.Accessor(o)
		if err != nil {
			t.Fatal(err)
		}
		kind := strings.ToLower(o.GetObjectKind().GroupVersionKind().Kind)
		line := `(?m)^` + regexp.QuoteMeta(kind) + `(\.[a-z0-9.]+)?/` + regexp.QuoteMeta(m.GetName()) + ` (created|configured|unchanged) \(server dry run\)$`
		if !regexp.MustCompile(line).Match(out) {
			t.Errorf("no dry-run result for %s %s/%s", kind, m.GetNamespace(), m.GetName())
		}
	}
}

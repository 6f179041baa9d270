package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// The IBM Cloud preset (examples/ibm-cloud) checked against what IBM documents for IKS VPC
// clusters (docs/ibm-cloud.md cites each fact).
var (
	ibmDir    = filepath.Join(root, "examples", "ibm-cloud")
	ibmValues = filepath.Join(ibmDir, "values.yaml")
	// IKS flavors and the node.kubernetes.io/instance-type label are dotted
	// (gx3d.208x1792.8mi300x); the VPC profile name is dashed (gx3d-208x1792x8mi300x).
	iksFlavor  = regexp.MustCompile(`^[a-z0-9]+\.[0-9]+x[0-9]+(\.[a-z0-9]+)*$`)
	icrImage   = regexp.MustCompile(`^([a-z-]+\.)?icr\.io/`)
	workerUser = regexp.MustCompile(`(?m)^USER (\d+):(\d+)$`)
)

func TestIBMCloudPresetInstallsWhatIKSRuns(t *testing.T) {
	objs := mustRender(t, "-f", ibmValues)

	// Checkpoint shares owned by the workers' uid/gid (IBM's classes make them root's).
	var users [][]string
	for _, f := range []string{"Dockerfile", "Dockerfile.rocm"} {
		df, err := os.ReadFile(filepath.Join(root, "workers", f))
		if err != nil {
			t.Fatal(err)
		}
		u := workerUser.FindAllStringSubmatch(string(df), -1)
		if len(u) == 0 {
			t.Fatalf("workers/%s sets no USER uid:gid", f)
		}
		users = append(users, u...)
	}
	sc := typed[storagev1.StorageClass](t, find(objs, "StorageClass", "", ""))
	for _, u := range users {
		if sc.Parameters["uid"] != u[1] || sc.Parameters["gid"] != u[2] {
			t.Errorf("StorageClass %s parameters %v: want uid %s and gid %s, the worker image's user", sc.Name, sc.Parameters, u[1], u[2])
		}
	}
	if sc.Provisioner != "vpc.file.csi.ibm.io" || sc.Parameters["profile"] != "dp2" {
		t.Errorf("StorageClass %s: provisioner %q profile %q, want IBM's VPC file driver with dp2", sc.Name, sc.Provisioner, sc.Parameters["profile"])
	}
	if want := []string{"hard", "nfsvers=4.1", "sec=sys"}; !slices.Equal(sc.MountOptions, want) {
		t.Errorf("StorageClass %s mounts with %v, want %v (IBM's own VPC file classes)", sc.Name, sc.MountOptions, want)
	}
	if sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		t.Errorf("StorageClass binding %v: the share must be made in the zone of the ranks", sc.VolumeBindingMode)
	}
	if sc.ReclaimPolicy == nil || *sc.ReclaimPolicy != corev1.PersistentVolumeReclaimRetain || sc.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("StorageClass %s: reclaim %v, annotations %v: checkpoints and the class outlive claims and releases", sc.Name, sc.ReclaimPolicy, sc.Annotations)
	}

	// Secure by Default VPC clusters reach no public registry: every image is ICR's.
	dep := typed[appsv1.Deployment](t, find(objs, "Deployment", "zaya-system", ""))
	for _, c := range dep.Spec.Template.Spec.Containers {
		if !icrImage.MatchString(c.Image) {
			t.Errorf("container %s image %q: not from IBM Cloud Container Registry", c.Name, c.Image)
		}
		for _, a := range c.Args {
			for _, flag := range []string{"--spare-image=", "--supervisor-image="} {
				if img, ok := strings.CutPrefix(a, flag); ok && !icrImage.MatchString(img) {
					t.Errorf("%s%q: not from IBM Cloud Container Registry", flag, img)
				}
			}
		}
		if !slices.Contains(c.Args, "--supervisor-image=us.icr.io/zaya/zaya-worker:rocm") {
			t.Errorf("args %v: the supervisor should come from the mirrored worker image the jobs run", c.Args)
		}
	}
	if !slices.ContainsFunc(dep.Spec.Template.Spec.ImagePullSecrets, func(r corev1.LocalObjectReference) bool { return r.Name == "all-icr-io" }) {
		t.Errorf("pull secrets %v: want all-icr-io", dep.Spec.Template.Spec.ImagePullSecrets)
	}

	// The monitoring agent scrapes from the host network: a namespace selector admits nothing.
	np := typed[networkingv1.NetworkPolicy](t, find(objs, "NetworkPolicy", "zaya-system", ""))
	for _, rule := range np.Spec.Ingress {
		for _, from := range rule.From {
			if from.IPBlock == nil {
				t.Errorf("NetworkPolicy admits %+v: IBM Cloud Monitoring's agent runs on the host network, only an ipBlock matches it", from)
			}
		}
	}
	if len(np.Spec.Ingress) == 0 {
		t.Error("NetworkPolicy admits no scrapes at all")
	}
}

func TestIBMCloudJobsFitTheNodesIKSGives(t *testing.T) {
	sc := typed[storagev1.StorageClass](t, find(mustRender(t, "-f", ibmValues), "StorageClass", "", ""))
	files, _ := filepath.Glob(filepath.Join(ibmDir, "*.yaml"))
	var jobs int
	for _, f := range files {
		if filepath.Base(f) == "values.yaml" {
			continue
		}
		for _, job := range manifestJobs(t, f) {
			checkIBMJob(t, filepath.Base(f), job, sc)
			jobs++
		}
	}
	if jobs < 2 {
		t.Errorf("%d example jobs in %s, want the public-profile one and the Pollara one", jobs, ibmDir)
	}
}

// checkIBMJob checks a job meant for IKS against what IKS gives (docs/ibm-cloud.md): nodes
// selected by worker pool, never by the VPC profile's dashed name; the checkpoint class the
// chart makes with the workers' uid/gid (sc); images from ICR; amd.com/nic only in a
// manifest for workers with Pollara NICs (the public profile has none).
func checkIBMJob(t *testing.T, name string, job *trainingv1alpha1.ZayaTrainingJob, sc *storagev1.StorageClass) {
	t.Helper()
	ps := job.Spec.Template.Spec
	labels := nodeLabels(job)
	if v, ok := labels[corev1.LabelInstanceTypeStable]; ok && !iksFlavor.MatchString(v) {
		t.Errorf("%s selects %s=%s: IKS labels nodes with the dotted flavor name, no node has that value", name, corev1.LabelInstanceTypeStable, v)
	}
	if labels["ibm-cloud.kubernetes.io/worker-pool-name"] == "" {
		t.Errorf("%s: no worker pool selected", name)
	}
	if v := job.Spec.Checkpoint.Volume; v.ClaimName == "" && ptr.Deref(v.StorageClassName, "") != sc.Name {
		t.Errorf("%s: checkpoint class %q, want %s (the workers' uid/gid; IBM's own classes make root's shares)", name, ptr.Deref(v.StorageClassName, "(the default)"), sc.Name)
	}
	for _, c := range ps.Containers {
		if !icrImage.MatchString(c.Image) {
			t.Errorf("%s: image %q not from IBM Cloud Container Registry", name, c.Image)
		}
	}
	// The public gx3d MI300X profile is not cluster-network capable: no amd.com/nic. Only a
	// job for workers with Pollara NICs (named so) requests them, one per GPU.
	if nics, needsNICs := job.Spec.NICsPerNode(), strings.Contains(filepath.Base(name), "pollara"); (nics > 0) != needsNICs {
		t.Errorf("%s: profile %s requests %d amd.com/nic per node; the public profile has none, a Pollara build has one per GPU",
			name, job.Spec.Network.Profile, nics)
	}
}

// nodeLabels are the node labels a job's pods require: its node selector and the In values
// of its required node affinity.
func nodeLabels(job *trainingv1alpha1.ZayaTrainingJob) map[string]string {
	ps := job.Spec.Template.Spec
	labels := map[string]string{}
	for k, v := range ps.NodeSelector {
		labels[k] = v
	}
	if a := ps.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, e := range term.MatchExpressions {
				for _, v := range e.Values {
					labels[e.Key] = v
				}
			}
		}
	}
	return labels
}

// The metrics policy admits each zone's own default address prefix (IBM's table, in
// docs/ibm-cloud.md): a zone's scrapes come from its workers' subnets.
func TestTheMetricsPolicyAdmitsTheDefaultPrefixOfEachZone(t *testing.T) {
	for _, tc := range []struct {
		zones string
		want  []string
	}{
		{"{us-south-1}", []string{"10.240.0.0/18"}},
		{"{us-east-1}", []string{"10.241.0.0/18"}},
		{"{eu-de-1}", []string{"10.243.0.0/18"}},
		{"{us-east-1,us-east-2,us-east-3}", []string{"10.241.0.0/18", "10.241.64.0/18", "10.241.128.0/18"}},
		{"{eu-de-3}", []string{"10.243.128.0/18"}},
	} {
		t.Run(tc.zones, func(t *testing.T) {
			objs := mustRender(t, "--set", "networkPolicy.enabled=true", "--set", "networkPolicy.vpcZones="+tc.zones)
			np := typed[networkingv1.NetworkPolicy](t, find(objs, "NetworkPolicy", "zaya-system", ""))
			if got := policyCIDRs(np); !slices.Equal(got, tc.want) {
				t.Errorf("admits %v, want %v", got, tc.want)
			}
		})
	}
	// The preset admits the zones its jobs are pinned to.
	np := typed[networkingv1.NetworkPolicy](t, find(mustRender(t, "-f", ibmValues), "NetworkPolicy", "zaya-system", ""))
	admitted := policyCIDRs(np)
	files, _ := filepath.Glob(filepath.Join(ibmDir, "*.yaml"))
	for _, f := range files {
		if filepath.Base(f) == "values.yaml" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		job := &trainingv1alpha1.ZayaTrainingJob{}
		if err := yaml.UnmarshalStrict(b, job); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		zones := jobZones(job)
		if len(zones) == 0 {
			t.Errorf("%s pins no zone: the preset's policy cannot know which prefix its workers scrape from", filepath.Base(f))
		}
		for _, z := range zones {
			want := map[string]string{"us-south-1": "10.240.0.0/18", "us-east-1": "10.241.0.0/18", "eu-de-1": "10.243.0.0/18"}[z]
			if want == "" || !slices.Contains(admitted, want) {
				t.Errorf("%s runs in %s; the preset's policy admits %v", filepath.Base(f), z, admitted)
			}
		}
	}
}

// policyCIDRs are the ipBlocks a NetworkPolicy admits, in order.
func policyCIDRs(np *networkingv1.NetworkPolicy) []string {
	var out []string
	for _, rule := range np.Spec.Ingress {
		for _, from := range rule.From {
			if from.IPBlock != nil {
				out = append(out, from.IPBlock.CIDR)
			}
		}
	}
	return out
}

// jobZones are the zones a job's pods are required to run in.
func jobZones(job *trainingv1alpha1.ZayaTrainingJob) []string {
	var out []string
	if z, ok := job.Spec.Template.Spec.NodeSelector["topology.kubernetes.io/zone"]; ok {
		out = append(out, z)
	}
	if a := job.Spec.Template.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, e := range term.MatchExpressions {
				if e.Key == "topology.kubernetes.io/zone" && e.Operator == corev1.NodeSelectorOpIn {
					out = append(out, e.Values...)
				}
			}
		}
	}
	return out
}

// A zone the chart does not know, or an address that is no CIDR, is refused at install, naming
// the value.
func TestTheMetricsPolicyRefusesWhatIsNoZoneOrCIDR(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct{ values, want string }{
		"unknown zone":   {"networkPolicy:\n  enabled: true\n  vpcZones: [us-east-4]\n", "/networkPolicy/vpcZones/0"},
		"region":         {"networkPolicy:\n  enabled: true\n  vpcZones: [us-east]\n", "/networkPolicy/vpcZones/0"},
		"empty cidr":     {"networkPolicy:\n  enabled: true\n  metricsFrom:\n  - ipBlock:\n      cidr: \"\"\n", "/networkPolicy/metricsFrom/0/ipBlock/cidr"},
		"no prefix":      {"networkPolicy:\n  enabled: true\n  metricsFrom:\n  - ipBlock:\n      cidr: 10.241.0.0\n", "/networkPolicy/metricsFrom/0/ipBlock/cidr"},
		"bad octet":      {"networkPolicy:\n  enabled: true\n  metricsFrom:\n  - ipBlock:\n      cidr: 10.256.0.0/18\n", "/networkPolicy/metricsFrom/0/ipBlock/cidr"},
		"no cidr at all": {"networkPolicy:\n  enabled: true\n  metricsFrom:\n  - ipBlock: {}\n", "/networkPolicy/metricsFrom/0/ipBlock"},
	} {
		t.Run(name, func(t *testing.T) {
			f := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".yaml")
			if err := os.WriteFile(f, []byte(tc.values), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := render(t, "-f", f); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("want an error naming %s, got %v", tc.want, err)
			}
		})
	}
}

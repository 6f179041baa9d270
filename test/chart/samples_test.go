package chart

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// Every manifest a user may apply (config/samples, examples/) names the cluster it is for on
// its first line, "# cluster: ibm-cloud" or "# cluster: kubernetes", and is checked against
// that cluster's facts: IKS's (docs/ibm-cloud.md) or those of any conformant cluster (no
// cloud's labels, storage classes or instance types; the default storage class).
var clusterLine = regexp.MustCompile(`\A# cluster: (ibm-cloud|kubernetes)\n`)

// userManifests are the YAML files a user applies: every one under config/samples and
// examples/, but the kustomization and the chart values.
func userManifests(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{filepath.Join(root, "config", "samples"), filepath.Join(root, "examples")} {
		err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || filepath.Ext(p) != ".yaml" {
				return err
			}
			if b := filepath.Base(p); b == "kustomization.yaml" || b == "values.yaml" {
				return nil
			}
			out = append(out, p)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// manifestJobs decodes the ZayaTrainingJobs of a multi-document file, strictly.
func manifestJobs(t *testing.T, file string) []*trainingv1alpha1.ZayaTrainingJob {
	t.Helper()
	var jobs []*trainingv1alpha1.ZayaTrainingJob
	for _, doc := range documents(t, file) {
		if !bytes.Contains(doc, []byte("kind: ZayaTrainingJob")) {
			continue
		}
		job := &trainingv1alpha1.ZayaTrainingJob{}
		if err := yaml.UnmarshalStrict(doc, job); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		job.Default()
		jobs = append(jobs, job)
	}
	return jobs
}

// documents splits a YAML file into its documents.
func documents(t *testing.T, file string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var out [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(bytes.TrimSpace(doc)) > 0 {
			out = append(out, doc)
		}
	}
}

func TestEveryManifestFitsTheClusterItNames(t *testing.T) {
	sc := typed[storagev1.StorageClass](t, find(mustRender(t, "-f", ibmValues), "StorageClass", "", ""))
	files := userManifests(t)
	if len(files) < 7 {
		t.Fatalf("found %d manifests under config/samples and examples", len(files))
	}
	for _, f := range files {
		name, _ := filepath.Rel(root, f)
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m := clusterLine.FindSubmatch(b)
		if m == nil {
			t.Errorf("%s: its first line does not name its cluster (# cluster: ibm-cloud or # cluster: kubernetes)", name)
			continue
		}
		text := string(b)
		for _, doc := range documents(t, f) {
			if !bytes.Contains(doc, []byte("kind: PersistentVolumeClaim")) {
				continue
			}
			pvc := &corev1.PersistentVolumeClaim{}
			if err := yaml.UnmarshalStrict(doc, pvc); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			checkClaim(t, name, string(m[1]), pvc, sc)
		}
		jobs := manifestJobs(t, f)
		if len(jobs) == 0 {
			t.Errorf("%s holds no ZayaTrainingJob", name)
		}
		for _, job := range jobs {
			switch string(m[1]) {
			case "ibm-cloud":
				checkIBMJob(t, name, job, sc)
			default:
				checkPlainJob(t, name, text, job)
			}
		}
	}
}

// checkPlainJob checks a job meant for any cluster: it selects nodes only by labels every
// MI300X cluster can have (Kubernetes' own, AMD's NFD through placement), claims on the
// default storage class, and asks for amd.com/nic only where the manifest says the workers
// need AMD's network operator.
func checkPlainJob(t *testing.T, name, text string, job *trainingv1alpha1.ZayaTrainingJob) {
	t.Helper()
	for k, v := range nodeLabels(job) {
		if k == corev1.LabelInstanceTypeStable || strings.HasPrefix(k, "ibm-cloud.kubernetes.io/") {
			t.Errorf("%s selects nodes by %s=%s: a label of one cloud; select by NFD (placement.gpuNodeSelector) or say the cluster", name, k, v)
		}
	}
	if c := job.Spec.Checkpoint.Volume.StorageClassName; c != nil {
		t.Errorf("%s: checkpoint class %q: a class one cluster has; leave it to the cluster's default or say the cluster", name, *c)
	}
	if job.Spec.NICsPerNode() > 0 && !strings.Contains(text, "amd.com/nic") {
		t.Errorf("%s: profile %s asks for amd.com/nic without saying that the workers must advertise it", name, job.Spec.Network.Profile)
	}
}

// checkClaim checks a claim of a manifest: on IBM Cloud the chart's class (the workers'
// uid/gid), elsewhere the cluster's default.
func checkClaim(t *testing.T, name, cluster string, pvc *corev1.PersistentVolumeClaim, sc *storagev1.StorageClass) {
	t.Helper()
	c := pvc.Spec.StorageClassName
	switch {
	case cluster == "ibm-cloud" && (c == nil || *c != sc.Name):
		t.Errorf("%s: claim %s on class %v, want %s (the workers' uid/gid)", name, pvc.Name, c, sc.Name)
	case cluster == "kubernetes" && c != nil:
		t.Errorf("%s: claim %s on class %q: a class one cluster has; leave it to the cluster's default", name, pvc.Name, *c)
	}
}

package v1alpha1

import (
	"fmt"
	"maps"
	pathpkg "path"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Names the operator owns inside worker pods.
const (
	// CheckpointVolumeName is the pod volume that holds the checkpoint claim.
	CheckpointVolumeName = "zaya-checkpoints"
	// ShmVolumeName is the memory-backed /dev/shm volume.
	ShmVolumeName = "zaya-shm"
	// ShmMountPath is where ShmVolumeName is mounted.
	ShmMountPath = "/dev/shm"
	// SupervisorVolumeName is the emptyDir that hands zaya-supervisor to the worker container
	// (faultTolerance.supervisor Inject).
	SupervisorVolumeName = "zaya-bin"
	// SupervisorMountPath is where the worker container sees SupervisorVolumeName.
	SupervisorMountPath = "/zaya/bin"
	// SupervisorInitContainerName is the init container that copies zaya-supervisor there.
	SupervisorInitContainerName = "zaya-supervisor-install"
	// SupervisorImagePath is where a supervisor image holds the binary (the worker image's).
	SupervisorImagePath = "/usr/local/bin/zaya-supervisor"
)

// envNameRE is what an RCCL/NCCL variable name may look like.
var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// reservedEnv are variables of the worker contract that only the operator sets.
var reservedEnv = []string{
	"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "NNODES",
	"GPUS_PER_NODE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
}

// reservedEnvPrefixes are prefixes of variables that only the operator sets.
var reservedEnvPrefixes = []string{"PET_", "ZAYA_"}

// IsReservedEnv reports whether name is a worker-contract variable that only the operator sets.
func IsReservedEnv(name string) bool {
	if slices.Contains(reservedEnv, name) {
		return true
	}
	for _, p := range reservedEnvPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// ValidateSpec checks the rules the CRD schema cannot express within the apiserver's CEL cost
// budget: network.env names, and how the pod template may combine with what the operator adds. The apiserver enforces everything else at apply
// time; the operator calls this before creating anything.
func ValidateSpec(spec *ZayaTrainingJobSpec) field.ErrorList {
	var errs field.ErrorList
	envPath := field.NewPath("spec", "network", "env")
	for i := range spec.Network.Env {
		if name := spec.Network.Env[i].Name; !envNameRE.MatchString(name) {
			errs = append(errs, field.Invalid(envPath.Index(i).Child("name"), name, "must be a C identifier ([A-Za-z_][A-Za-z0-9_]*)"))
		}
	}
	podPath := field.NewPath("spec", "template", "spec")
	pod := &spec.Template.Spec

	for i := range pod.Volumes {
		if v := pod.Volumes[i].Name; v == CheckpointVolumeName || v == ShmVolumeName || v == SupervisorVolumeName {
			errs = append(errs, field.Invalid(podPath.Child("volumes").Index(i).Child("name"), v,
				"volume name is reserved for the operator"))
		}
	}
	for i := range pod.InitContainers {
		path := podPath.Child("initContainers").Index(i)
		errs = append(errs, validateContainer(spec, &pod.InitContainers[i], path)...)
		if pod.InitContainers[i].Name == SupervisorInitContainerName {
			errs = append(errs, field.Invalid(path.Child("name"), SupervisorInitContainerName, "container name is reserved for the operator"))
		}
	}
	for i := range pod.Containers {
		c := &pod.Containers[i]
		path := podPath.Child("containers").Index(i)
		errs = append(errs, validateContainer(spec, c, path)...)
		if c.Name == SupervisorInitContainerName {
			errs = append(errs, field.Invalid(path.Child("name"), SupervisorInitContainerName, "container name is reserved for the operator"))
		}
		// The operator owns the regular containers' restart behaviour (faultTolerance.restartMode);
		// a rule of the template's own could restart a rank the gang has left behind.
		if c.RestartPolicy != nil {
			errs = append(errs, field.Forbidden(path.Child("restartPolicy"),
				"set by the operator from spec.faultTolerance (restartMode, exitCodes)"))
		}
		if len(c.RestartPolicyRules) > 0 {
			errs = append(errs, field.Forbidden(path.Child("restartPolicyRules"),
				"set by the operator from spec.faultTolerance (restartMode, exitCodes)"))
		}
	}
	return errs
}

func validateContainer(spec *ZayaTrainingJobSpec, c *corev1.Container, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, r := range []struct {
		kind string
		list corev1.ResourceList
	}{{"limits", c.Resources.Limits}, {"requests", c.Resources.Requests}} {
		for _, name := range slices.Sorted(maps.Keys(r.list)) {
			if strings.HasPrefix(string(name), "amd.com/") {
				errs = append(errs, field.Forbidden(path.Child("resources", r.kind).Key(string(name)),
					"AMD devices are requested by the operator: set spec.gpusPerNode and spec.network.nicsPerNode"))
			}
		}
	}
	for i := range c.Env {
		if IsReservedEnv(c.Env[i].Name) {
			errs = append(errs, field.Forbidden(path.Child("env").Index(i).Child("name"),
				c.Env[i].Name+" is set by the operator (worker contract)"))
		}
	}
	for i := range c.EnvFrom {
		if p := c.EnvFrom[i].Prefix; p != "" && (IsReservedEnv(p) || slices.ContainsFunc(reservedEnvPrefixes, func(r string) bool { return strings.HasPrefix(r, p) })) {
			errs = append(errs, field.Forbidden(path.Child("envFrom").Index(i).Child("prefix"),
				fmt.Sprintf("prefix %q would name variables of the worker contract (%s*), which only the operator sets", p, strings.Join(reservedEnvPrefixes, "*, "))))
		}
	}
	for i := range c.VolumeMounts {
		// Compare clean paths: /dev/shm/, /dev//shm and /x/../dev/shm are all /dev/shm.
		m := c.VolumeMounts[i].MountPath
		clean := pathpkg.Clean("/" + m)
		if clean == ShmMountPath || clean == SupervisorMountPath || (spec.Checkpoint != nil && clean == pathpkg.Clean("/"+spec.Checkpoint.MountPath)) {
			errs = append(errs, field.Invalid(path.Child("volumeMounts").Index(i).Child("mountPath"), m,
				"mount path is used by the operator (checkpoint volume, /dev/shm or /zaya/bin)"))
		}
	}
	return errs
}

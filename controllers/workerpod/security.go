package workerpod

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// restrictByDefault fills in what Pod Security "restricted" asks of a container wherever the
// template leaves it open and doing so cannot take anything from the worker: no privilege
// escalation (no setuid binaries), and no capabilities for a container that does not run as
// root (a non-root process holds none that take effect). Running as non-root and the seccomp
// profile stay the template's call: only it knows the image, and ROCm's container guides run
// without the runtime's default seccomp profile. docs/security.md has the whole picture.
func restrictByDefault(c *corev1.Container, pod *corev1.PodSecurityContext) {
	sc := c.SecurityContext
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	mayEscalate := ptr.Deref(sc.Privileged, false) ||
		(sc.Capabilities != nil && slices.ContainsFunc(sc.Capabilities.Add, func(c corev1.Capability) bool {
			return c == "SYS_ADMIN" || c == "CAP_SYS_ADMIN" // the API refuses allowPrivilegeEscalation=false with these
		}))
	if sc.AllowPrivilegeEscalation == nil && !mayEscalate {
		sc.AllowPrivilegeEscalation = ptr.To(false)
	}
	if nonRoot(sc, pod) && !ptr.Deref(sc.Privileged, false) && (sc.Capabilities == nil || len(sc.Capabilities.Drop) == 0) {
		if sc.Capabilities == nil {
			sc.Capabilities = &corev1.Capabilities{}
		}
		sc.Capabilities.Drop = []corev1.Capability{"ALL"}
	}
	if *sc != (corev1.SecurityContext{}) {
		c.SecurityContext = sc
	}
}

// nonRoot reports whether the template promises the container does not run as root.
func nonRoot(sc *corev1.SecurityContext, pod *corev1.PodSecurityContext) bool {
	if sc.RunAsUser != nil {
		return *sc.RunAsUser != 0
	}
	if sc.RunAsNonRoot != nil {
		return *sc.RunAsNonRoot
	}
	if pod == nil {
		return false
	}
	if pod.RunAsUser != nil {
		return *pod.RunAsUser != 0
	}
	return ptr.Deref(pod.RunAsNonRoot, false)
}

func addCapability(c *corev1.Container, capability corev1.Capability) {
	if c.SecurityContext == nil {
		c.SecurityContext = &corev1.SecurityContext{}
	}
	if c.SecurityContext.Capabilities == nil {
		c.SecurityContext.Capabilities = &corev1.Capabilities{}
	}
	if !slices.Contains(c.SecurityContext.Capabilities.Add, capability) {
		c.SecurityContext.Capabilities.Add = append(c.SecurityContext.Capabilities.Add, capability)
	}
}

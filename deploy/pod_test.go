package deploy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kvexact/kvexact/containers"
)

// pod is what the kubelet would set up for a pod's first container: its files on the host
// (bound where the container mounts them) and its process identity. It follows the kubelet's
// rules, not the manifest's intent, so a mode or ownership mistake in the manifest shows here as it
// would on a node.
type pod struct {
	mounts   []containers.Mount
	security containers.Security
	// paths maps a container path of a mounted file or folder to its host path.
	paths map[string]string
}

// kubelet rules (pkg/volume/volume_linux.go, pkg/volume/{secret,configmap,emptydir}): a Secret's
// or ConfigMap's keys become files of mode defaultMode (0644 unset) owned by root:root; with a pod
// fsGroup their group becomes fsGroup and the read-only mask 0440 is or-ed into the mode. An
// emptyDir is a 0777 folder. runAsGroup unset leaves gid 0 (a scratch image names no group);
// fsGroup and supplementalGroups are supplementary groups of the process.
func materialize(t *testing.T, spec corev1.PodSpec, objs map[string]any, edit func(kind, name, key string, v []byte) []byte) *pod {
	t.Helper()
	c := spec.Containers[0]
	psc := spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	uid, gid := int64(0), int64(0)
	if psc.RunAsUser != nil {
		uid = *psc.RunAsUser
	}
	if psc.RunAsGroup != nil {
		gid = *psc.RunAsGroup
	}
	csc := c.SecurityContext
	if csc != nil && csc.RunAsUser != nil {
		uid = *csc.RunAsUser
	}
	if csc != nil && csc.RunAsGroup != nil {
		gid = *csc.RunAsGroup
	}
	p := &pod{paths: map[string]string{}}
	p.security.User = fmt.Sprintf("%d:%d", uid, gid)
	if psc.FSGroup != nil {
		p.security.Groups = append(p.security.Groups, strconv.FormatInt(*psc.FSGroup, 10))
	}
	for _, g := range psc.SupplementalGroups {
		p.security.Groups = append(p.security.Groups, strconv.FormatInt(g, 10))
	}
	if csc != nil {
		p.security.ReadOnlyRootfs = csc.ReadOnlyRootFilesystem != nil && *csc.ReadOnlyRootFilesystem
		p.security.NoNewPrivileges = csc.AllowPrivilegeEscalation != nil && !*csc.AllowPrivilegeEscalation
		if csc.Capabilities != nil {
			for _, d := range csc.Capabilities.Drop {
				p.security.CapDrop = append(p.security.CapDrop, string(d))
			}
		}
	}
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	vols := map[string]string{} // volume name → host folder
	for _, v := range spec.Volumes {
		dir := filepath.Join(root, v.Name)
		var data map[string][]byte
		var mode int32 = 0o644
		kind, name := "", ""
		switch {
		case v.Secret != nil:
			kind, name = "Secret", v.Secret.SecretName
			s, ok := objs["Secret/"+name].(*corev1.Secret)
			if !ok {
				t.Fatalf("volume %s: no Secret %s in the manifests", v.Name, name)
			}
			data = map[string][]byte{}
			for k, b := range s.Data {
				data[k] = b
			}
			for k, s := range s.StringData {
				data[k] = []byte(s)
			}
			if len(v.Secret.Items) > 0 { // only the listed keys, under their paths
				all := data
				data = map[string][]byte{}
				for _, it := range v.Secret.Items {
					b, ok := all[it.Key]
					if !ok {
						t.Fatalf("volume %s: Secret %s has no key %s", v.Name, name, it.Key)
					}
					data[it.Path] = b
				}
			}
			if v.Secret.DefaultMode != nil {
				mode = *v.Secret.DefaultMode
			}
		case v.ConfigMap != nil:
			kind, name = "ConfigMap", v.ConfigMap.Name
			cm, ok := objs["ConfigMap/"+name].(*corev1.ConfigMap)
			if !ok {
				t.Fatalf("volume %s: no ConfigMap %s in the manifests", v.Name, name)
			}
			data = map[string][]byte{}
			for k, s := range cm.Data {
				data[k] = []byte(s)
			}
			if v.ConfigMap.DefaultMode != nil {
				mode = *v.ConfigMap.DefaultMode
			}
		case v.EmptyDir != nil:
			if err := os.Mkdir(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			os.Chmod(dir, 0o777) // past the umask
			vols[v.Name] = dir
			continue
		default:
			t.Fatalf("volume %s: only Secret, ConfigMap and emptyDir volumes can be run here (a claim needs a cluster)", v.Name)
		}
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		fileGID := 0
		if psc.FSGroup != nil {
			fileGID = int(*psc.FSGroup)
			mode |= 0o440
		}
		for k, b := range data {
			if edit != nil {
				b = edit(kind, name, k, b)
			}
			f := filepath.Join(dir, k)
			if err := os.WriteFile(f, b, 0o600); err != nil {
				t.Fatal(err)
			}
			if os.Geteuid() == 0 { // elsewhere the files stay the test's (only the container test needs root)
				if err := os.Chown(f, 0, fileGID); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chmod(f, os.FileMode(mode)); err != nil {
				t.Fatal(err)
			}
		}
		vols[v.Name] = dir
	}
	for _, m := range c.VolumeMounts {
		host, ok := vols[m.Name]
		if !ok {
			t.Fatalf("mount %s: no volume %s", m.MountPath, m.Name)
		}
		if m.SubPath != "" {
			host = filepath.Join(host, m.SubPath)
		}
		p.mounts = append(p.mounts, containers.Mount{Host: host, Container: m.MountPath, ReadOnly: m.ReadOnly})
		p.paths[m.MountPath] = host
	}
	return p
}

// hostPath maps a path inside the container to the host file behind it ("" when unmounted).
func (p *pod) hostPath(ctr string) string {
	for mp, host := range p.paths {
		if ctr == mp {
			return host
		}
		if rest, ok := strings.CutPrefix(ctr, mp+"/"); ok {
			return filepath.Join(host, rest)
		}
	}
	return ""
}

package containers

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
)

// Image tags of the project's own binaries (ImageOf their command).
const (
	EngineSimImage = "kvexact/enginesim:dev"
	GatewayImage   = "kvexact/gateway:dev"
	CTKImage       = "kvexact/ctk:dev"
)

// ImageOf is the tag of a command's image: kvexact/<command>:dev.
func ImageOf(cmd string) string { return "kvexact/" + cmd + ":dev" }

// BuildImages builds the commands statically into out (BuildBinaries) and each one's FROM scratch
// image, tagged ImageOf(command) (BuildImage). It is the one way the images are made: the container
// tests call it, and so does make images (cmd/images). It returns the binaries' paths.
func (h *Harness) BuildImages(ctx context.Context, root, out string, cmds ...string) (map[string]string, error) {
	bins, err := BuildBinaries(ctx, root, out, cmds...)
	if err != nil {
		return nil, err
	}
	for _, c := range cmds {
		if err := h.BuildImage(ctx, ImageOf(c), bins[c]); err != nil {
			return nil, err
		}
	}
	return bins, nil
}

// ModuleRoot returns the directory of the kvexact go.mod, from the current directory upwards.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/kvexact/kvexact\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of github.com/kvexact/kvexact above the current directory")
		}
		dir = parent
	}
}

// BuildBinaries builds the named commands (enginesim, gateway, ctk, …) of the module at root into
// out, statically linked so that a FROM scratch image can run them: cgo stays on (the C hash core)
// and the external linker is told -static. It returns the paths by command name. The go command inherits the
// environment, so GOTOOLCHAIN and the build cache are the caller's.
func BuildBinaries(ctx context.Context, root, out string, cmds ...string) (map[string]string, error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("build: the go command is not on PATH: %w", err)
	}
	// Only the link differs from a plain `go build`, so every compiled package comes from the build
	// cache that `go test ./...` fills anyway. The pure-Go resolver serves (the containers only dial
	// 127.0.0.1 and a scratch image has no nsswitch.conf), so glibc's static getaddrinfo warning is moot.
	args := []string{"build", "-ldflags", `-s -w -linkmode external -extldflags "-static"`, "-o", out + string(filepath.Separator)}
	for _, c := range cmds {
		args = append(args, "./cmd/"+c)
	}
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if _, ok := os.LookupEnv("GOTOOLCHAIN"); !ok && strings.HasPrefix(runtime.Version(), "go1.") {
		// Build with the toolchain that built the caller (go.mod says go 1.27; the machine's own
		// go may be older and would refuse).
		cmd.Env = append(cmd.Env, "GOTOOLCHAIN="+runtime.Version())
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("build %s: %w\n%s", strings.Join(cmds, " "), err, stderr.String())
	}
	paths := map[string]string{}
	for _, c := range cmds {
		p := filepath.Join(out, c)
		if err := CheckStatic(p); err != nil {
			return nil, err
		}
		paths[c] = p
	}
	return paths, nil
}

// CheckStatic fails unless path is an ELF executable without a dynamic loader (PT_INTERP) or
// needed shared libraries — what a FROM scratch image can run.
func CheckStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked (it names a program interpreter)", path)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		return fmt.Errorf("%s needs shared libraries %v", path, libs)
	}
	return nil
}

// CABundle is where Debian keeps its CA certificates and Go's crypto/x509 reads them on Linux.
const CABundle = "/etc/ssl/certs/ca-certificates.crt"

// BuildImage builds tag (e.g. EngineSimImage) FROM scratch holding one static binary as its
// entrypoint and the host's CA bundle. The build context is a temporary folder with just the binary and the Dockerfile.
func (h *Harness) BuildImage(ctx context.Context, tag, binary string) error {
	if err := CheckStatic(binary); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "kvexact-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	name := filepath.Base(binary)
	if err := linkOrCopy(binary, filepath.Join(dir, name)); err != nil {
		return err
	}
	// The host's CA bundle, where Go's crypto/x509 looks for it: a gateway fetching tokenizers from
	// an https hub (tokenizers.hub) verifies the hub's certificate against it.
	if err := linkOrCopy(CABundle, filepath.Join(dir, "ca-certificates.crt")); err != nil {
		return fmt.Errorf("the image's CA bundle: %w (install Debian's ca-certificates)", err)
	}
	df := fmt.Sprintf("FROM scratch\nLABEL %s=image\nCOPY ca-certificates.crt %s\nCOPY %s /%s\nENTRYPOINT [\"/%s\"]\n", LabelHarness, CABundle, name, name, name)
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(df), 0o644); err != nil {
		return err
	}
	repo, tg, ok := strings.Cut(tag, ":")
	if !ok {
		tg = "latest"
	}
	var log bytes.Buffer
	req := &testcontainers.ContainerRequest{FromDockerfile: testcontainers.FromDockerfile{
		Context: dir, Dockerfile: "Dockerfile", Repo: repo, Tag: tg, KeepImage: true, BuildLogWriter: &log,
	}}
	if _, err := h.provider.BuildImage(ctx, req); err != nil {
		return fmt.Errorf("build image %s: %w\n%s", tag, err, log.String())
	}
	// The previous build of the tag is now dangling: remove it (images in use are kept by Docker).
	_, _ = h.cli.ImagePrune(ctx, client.ImagePruneOptions{Filters: client.Filters{}.Add("dangling", "true").Add("label", LabelHarness+"=image")})
	return nil
}

func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// HasImage reports whether the daemon holds an image by that reference (nothing is pulled).
func (h *Harness) HasImage(ctx context.Context, ref string) bool {
	_, err := h.cli.ImageInspect(ctx, ref)
	return err == nil
}

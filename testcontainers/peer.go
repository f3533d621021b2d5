package testcontainers

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	tc "github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Peers: programs tests talk to that are not PostgreSQL (a syslog
// receiver, an SMTP server: rsyslog.go, smtp.go), run in containers built
// locally from Debian packages by peerimage/build.sh, since no registry
// can be reached.

// PeerOptions says what StartPeer runs.
type PeerOptions struct {
	// Image is the image's name; Packages the Debian packages it holds,
	// built with peerimage/build.sh on first use when the image is
	// missing.
	Image    string
	Packages []string
	// Setup returns the command the container runs, in the foreground,
	// listening on port, and the files copied into the container before
	// it starts, by path.
	Setup func(port int) (cmd []string, files map[string][]byte)
	// Port is the TCP port the program listens on inside the container in
	// bridge mode, and WaitFor the log line that says it is ready (empty:
	// waits for the port).
	Port    int
	WaitFor string
}

// Peer is a running peer container.
type Peer struct {
	Container *tc.DockerContainer
	// Addr is host:port where the peer's Port is reached from the test.
	// It stays the same across Stop and Start.
	Addr string
}

// BuildPeerImage builds image from packages with peerimage/build.sh when
// it is missing. The script takes a lock per image, so parallel test
// binaries build it once.
func BuildPeerImage(ctx context.Context, image string, packages ...string) error {
	if imageExists(ctx, image) {
		return nil
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	args := append([]string{filepath.Join(root, "testcontainers", "peerimage", "build.sh"), image}, packages...)
	cmd := exec.CommandContext(ctx, "bash", args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("build %s from %v with peerimage/build.sh: %w\n%s", image, packages, err, out)
	}
	return nil
}

// StartPeer builds the image if needed and runs it, labelled like the
// PostgreSQL containers so a dead test's peers are swept. Where the Docker
// engine shares this network namespace the peer uses the host network on a
// free loopback port (so its address survives a restart), which it passes
// to Setup.
func StartPeer(t testing.TB, o PeerOptions) *Peer {
	t.Helper()
	configure()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := BuildPeerImage(ctx, o.Image, o.Packages...); err != nil {
		t.Fatal(err)
	}
	sweepStale(ctx)
	host, _ := os.Hostname()
	hostNet := engineIsLocal()
	// On the host network the port is one found free a moment before the
	// peer binds it, and another test's server can take it meanwhile: the
	// peer then exits at once. Such a start is tried again on another port.
	var (
		ctr  *tc.DockerContainer
		port string
	)
	for attempt := 1; ; attempt++ {
		var err error
		ctr, port, err = runPeer(ctx, o, host, hostNet)
		if err == nil {
			break
		}
		logs := peerLogs(ctr)
		if ctr != nil {
			_ = ctr.Terminate(context.Background())
		}
		if !hostNet || attempt == 3 || ctx.Err() != nil {
			t.Fatalf("run %s: %v\n%s", o.Image, err, logs)
		}
		t.Logf("run %s on port %s: %v; trying another port\n%s", o.Image, port, err, logs)
	}
	t.Cleanup(func() { _ = ctr.Terminate(context.Background()) })
	p := &Peer{Container: ctr, Addr: "127.0.0.1:" + port}
	if !hostNet {
		h, err := ctr.Host(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mapped, err := ctr.MappedPort(ctx, port+"/tcp")
		if err != nil {
			t.Fatal(err)
		}
		p.Addr = h + ":" + mapped.Port()
	}
	return p
}

// runPeer runs one container of o on a port of its own (a free loopback
// port on the host network, else o.Port mapped by the engine).
func runPeer(ctx context.Context, o PeerOptions, host string, hostNet bool) (*tc.DockerContainer, string, error) {
	port := strconv.Itoa(o.Port)
	if hostNet {
		p, err := freeLoopbackPort()
		if err != nil {
			return nil, port, err
		}
		port = p
	}
	n, _ := strconv.Atoi(port)
	cmd, content := o.Setup(n)
	var files []tc.ContainerFile
	for path, data := range content {
		files = append(files, tc.ContainerFile{Reader: bytes.NewReader(data), ContainerFilePath: path, FileMode: 0o644})
	}
	var strategy wait.Strategy = wait.ForListeningPort("0/tcp")
	if o.WaitFor != "" {
		strategy = wait.ForLog(o.WaitFor).WithPollInterval(200 * time.Millisecond).WithStartupTimeout(60 * time.Second)
	}
	opts := []tc.ContainerCustomizer{
		tc.WithCmd(cmd...),
		tc.WithFiles(files...),
		tc.WithWaitStrategy(strategy),
		tc.WithLabels(map[string]string{
			labelOwner:   "1",
			labelPID:     strconv.Itoa(os.Getpid()),
			labelHost:    host,
			labelStarted: strconv.FormatInt(time.Now().Unix(), 10),
		}),
		tc.WithHostConfigModifier(func(hc *container.HostConfig) {
			if hostNet {
				hc.NetworkMode = "host"
			}
		}),
	}
	if !hostNet {
		opts = append(opts, tc.WithExposedPorts(port+"/tcp"))
	}
	ctr, err := tc.Run(ctx, o.Image, opts...)
	return ctr, port, err
}

// peerLogs is what a peer that failed to start printed, for the test's
// failure message.
func peerLogs(ctr *tc.DockerContainer) string {
	if ctr == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, err := ctr.Logs(ctx)
	if err != nil {
		return ""
	}
	defer rc.Close()
	b, _ := io.ReadAll(io.LimitReader(rc, 8<<10))
	return string(b)
}

// ReadFile returns a file of the running peer.
func (p *Peer) ReadFile(ctx context.Context, path string) ([]byte, error) {
	rc, err := p.Container.CopyFileFromContainer(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("read %s of the peer: %w", path, err)
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// moduleRoot is the directory holding go.mod, found from the working
// directory (a test runs in its package's directory).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

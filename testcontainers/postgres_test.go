package testcontainers

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
	tc "github.com/testcontainers/testcontainers-go"
)

func TestMain(m *testing.M) { Main(m) }

// Two tests' databases never see each other's rows.
func TestDatabasesAreIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := NewDB(t), NewDB(t)
	if a.Name == b.Name {
		t.Fatalf("two tests got the same database %q", a.Name)
	}
	if _, err := a.Pool.Exec(ctx, `INSERT INTO mefor_message (channel, source, size, status) VALUES ('adt', 'test', 0, 'received')`); err != nil {
		t.Fatalf("insert into a: %v", err)
	}
	var n int
	if err := b.Pool.QueryRow(ctx, "SELECT count(*) FROM mefor_message").Scan(&n); err != nil {
		t.Fatalf("count in b: %v", err)
	}
	if n != 0 {
		t.Fatalf("database b sees %d messages written to a", n)
	}
	var tables int
	if err := b.Pool.QueryRow(ctx, "SELECT count(*) FROM mefor_migration").Scan(&tables); err != nil || tables == 0 {
		t.Fatalf("database b has no migrations applied (count %d, err %v)", tables, err)
	}
}

// The helper process for TestKilledBinaryContainerIsSwept: it starts a
// container, prints its id and waits to be killed.
func TestHelperStartAndHang(t *testing.T) {
	if os.Getenv("MEFOR_HARNESS_HELPER") != "1" {
		t.Skip("helper process for TestKilledBinaryContainerIsSwept")
	}
	s, err := StartServer(context.Background())
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	os.Stdout.WriteString("CONTAINER " + s.container.GetContainerID() + "\n")
	time.Sleep(10 * time.Minute)
}

// startHangingHelper runs TestHelperStartAndHang in a child test process
// (with env added to its environment) and returns it with the id of the
// container it started.
func startHangingHelper(t *testing.T, env ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStartAndHang$", "-test.v")
	cmd.Env = append(append(os.Environ(), "MEFOR_HARNESS_HELPER=1"), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var id string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "CONTAINER "); ok {
			id = rest
			break
		}
	}
	if id == "" {
		_ = cmd.Process.Kill()
		t.Fatal("helper process did not report a container")
	}
	return cmd, id
}

// A test binary killed with SIGKILL cannot stop its container; the next
// start must remove it (there is no Ryuk to do it here).
func TestKilledBinaryContainerIsSwept(t *testing.T) {
	ctx := context.Background()
	cmd, id := startHangingHelper(t)
	kill(cmd)
	wantSwept(ctx, t, "container "+id, func() bool {
		res, err := dockerClient(ctx, t).ContainerList(ctx, client.ContainerListOptions{All: true, Filters: client.Filters{}.Add("id", id)})
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Items) > 0
	})
}

// kill SIGKILLs a helper process and waits for it to end.
func kill(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// wantSwept fails the test unless what (left by a killed test process)
// exists now and is gone after a sweep.
func wantSwept(ctx context.Context, t *testing.T, what string, exists func() bool) {
	t.Helper()
	if !exists() {
		t.Fatalf("%s vanished before the sweep: the test proves nothing", what)
	}
	sweepStale(ctx)
	if exists() {
		t.Fatalf("%s of a killed test process survived the sweep", what)
	}
}

// dockerClient is a client of the Docker engine, closed when the test ends.
func dockerClient(ctx context.Context, t *testing.T) *tc.DockerClient {
	t.Helper()
	cli, err := tc.NewDockerClientWithOpts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

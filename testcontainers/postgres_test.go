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
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	if !containerExists(ctx, t, id) {
		t.Fatal("container vanished before the sweep: the test proves nothing")
	}
	sweepStale(ctx)
	if containerExists(ctx, t, id) {
		t.Fatalf("container %s of a killed test process survived the sweep", id)
	}
}

func containerExists(ctx context.Context, t *testing.T, id string) bool {
	t.Helper()
	cli, err := tc.NewDockerClientWithOpts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: client.Filters{}.Add("id", id)})
	if err != nil {
		t.Fatal(err)
	}
	return len(res.Items) > 0
}

package pipeline_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/testcontainers"
)

// BenchmarkReceiveFile stores files of 100 messages, each file in one
// transaction, and reports messages per second.
func BenchmarkReceiveFile(b *testing.B) {
	db := testcontainers.NewDB(b)
	ins, err := river.NewClient(riverpgxv5.New(db.Pool), &river.Config{})
	if err != nil {
		b.Fatal(err)
	}
	const per = 100
	msgs := make([]pipeline.Inbound, per)
	for i := range msgs {
		raw := fmt.Appendf(nil, "MSH|^~\\&|LAB|H|MEFOR|H|20240101||ORU^R01|C%d|P|2.5\rPID|1||P%d\rOBX|1|NM|GLU||5.5\r", i, i)
		msgs[i] = pipeline.Inbound{Raw: raw, ControlID: fmt.Sprintf("C%d", i), MessageType: "ORU", TriggerEvent: "R01"}
	}
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		name := fmt.Sprintf("f%d.hl7", i)
		f := pipeline.IntakeFile{Channel: "lab", Name: name, Size: 1, SHA256: sha256.Sum256([]byte(name)), Messages: msgs}
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := pipeline.ReceiveFile(ctx, tx, ins, f)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*per)/b.Elapsed().Seconds(), "msgs/s")
}

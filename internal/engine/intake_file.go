package engine

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/filesource"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
)

// errNotServing refuses a file on a node that does not hold the listener
// lease.
var errNotServing = errors.New("not the listener lease holder")

// StoreFile stores a file's messages and its record in one transaction,
// with the listener lease checked in it as for MLLP intake: a node that
// lost the lease stores nothing.
func (in *Intake) StoreFile(ctx context.Context, f *filesource.File) (filesource.Stored, error) {
	file := pipeline.IntakeFile{Channel: f.Channel, Name: f.Name, Size: f.Size, SHA256: f.SHA256, Keys: in.Keys}
	if in.Gate != nil {
		if !in.Gate.Serving() {
			return filesource.Stored{}, errNotServing
		}
		file.LeaseOwner = in.Gate.Owner()
	}
	for _, m := range f.Messages {
		h := m.Msg.Header()
		file.Messages = append(file.Messages, pipeline.Inbound{Channel: f.Channel, Source: pipeline.SourceFile, Raw: m.Raw,
			ControlID: h.ControlID, MessageType: h.MessageType, TriggerEvent: h.TriggerEvent,
			SendingApp: h.SendingApplication, SendingFacility: h.SendingFacility, PatientID: m.Msg.Get("PID-3.1")})
	}
	var r pipeline.FileReceipt
	err := pgx.BeginFunc(ctx, in.Pool, func(tx pgx.Tx) error {
		var err error
		r, err = pipeline.ReceiveFile(ctx, tx, in.Inserter, file)
		return err
	})
	if err != nil {
		return filesource.Stored{}, err
	}
	if !r.Duplicate {
		in.Wake.Notify(jobs.IngressLane(f.Channel))
	}
	return filesource.Stored{FileID: r.FileID, MessageIDs: r.MessageIDs, Duplicate: r.Duplicate}, nil
}

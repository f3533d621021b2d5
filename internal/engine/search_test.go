package engine_test

import (
	"context"
	"testing"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// Intake captures PID-3.1, so a message received over MLLP is found by
// patient.
func TestIntakeStoresPatientForSearch(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	listen := fixtures.FreeAddr(t)
	cluster.StartNode(t, db, testConfig(t, listen, `
  lab:
    type: mllp
    mllp: {address: "`+p.addr+`"}
`), nil)
	send(t, listen, adt("S000", "P777"), adt("S001", "P888"), adt("S002", "P777"))

	got, err := search.ListMessages(context.Background(), db.Pool, search.MessageFilter{Patient: "P777"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ControlID != "S002" || got[1].ControlID != "S000" {
		t.Fatalf("messages of patient P777 = %+v, want S002 and S000", got)
	}
	var stored string
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT patient_key FROM mefor_message WHERE control_id = 'S001'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != pipeline.PatientKey(nil, "P888") {
		t.Fatalf("patient_key = %q, want PatientKey(P888) = %q", stored, pipeline.PatientKey(nil, "P888"))
	}
}

package pipeline

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The operators' write functions (migration 024) finalize messages with a
// copy of finalizeSQL in PL/pgSQL (mefor_finalize), since they run in the
// database. The two must say the same thing: a message finalized by a
// drainer and one finalized by an operator's cancel end in the same
// status. This compares the statements, parameters aside, so a change to
// one that is not made to the other fails here.
func TestSQLFinalizerIsFinalizeSQL(t *testing.T) {
	src, err := os.ReadFile("../../migrations/sql/024_operator_writes.sql")
	if err != nil {
		t.Fatal(err)
	}
	body := regexp.MustCompile(`(?s)CREATE FUNCTION mefor_finalize\(p_ids bigint\[\]\).*?PERFORM mefor_lock_messages\(p_ids\);(.*?);\s*END \$\$;`).
		FindSubmatch(src)
	if body == nil {
		t.Fatal("mefor_finalize's statement not found in migration 024")
	}
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	sqlSide := norm(strings.ReplaceAll(string(body[1]), "p_ids", "$1::bigint[]"))
	if goSide := norm(finalizeSQL); sqlSide != goSide {
		t.Errorf("mefor_finalize (migration 024) and finalizeSQL differ:\nSQL: %s\nGo:  %s", sqlSide, goSide)
	}
}

package store

// PatientKey is what the store keeps, and searches by, for a patient
// identifier (PID-3.1): mefor_message.patient_key. Intake stores
// PatientKey(id) and `messages list --patient ID` looks up PatientKey(ID),
// so the two always agree. Today it is the identifier itself. Encryption
// at rest replaces it with a keyed blind index (an HMAC of the id), so the
// clear id is never stored, without any caller changing.
func PatientKey(id string) string { return id }

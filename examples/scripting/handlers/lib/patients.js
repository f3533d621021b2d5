// Shared helpers for handlers that deal with patients. Loaded before
// to-lab.js (javascript.libs), into the same global scope.

// isTestPatient reports whether a message is about one of the registration
// system's test patients: their MRN starts with 9999, or their family name
// is ZZTEST.
function isTestPatient(msg) {
  return msg.get("PID-3.1").indexOf("9999") === 0 || msg.get("PID-5.1") === "ZZTEST";
}

// labPatientId is the MRN as the lab keys patients: the facility prefix and
// eight digits, zero-padded.
function labPatientId(mrn) {
  var digits = mrn.replace(/\D/g, "");
  while (digits.length < 8) digits = "0" + digits;
  return "GH" + digits;
}

// The ADT feed as the laboratory system wants it. Runs once per message;
// msg is this message (edit it in place), ctx is what else the script may
// use. See docs/handlers.md for every call.
function transform(msg, ctx) {
  // Test patients never reach the lab: null filters the message out
  // (status "filtered"; nothing is delivered).
  if (isTestPatient(msg)) {
    ctx.log.info("test patient not sent to the lab; message", ctx.messageId);
    return null;
  }

  // PID-3: the lab's patient id, its own assigning authority, and only the
  // medical record number (the other identifiers stay with registration).
  var mrn = msg.get("PID-3.1");
  msg.set("PID-3", "");
  msg.set("PID-3.1", labPatientId(mrn));
  msg.set("PID-3.4", "GHLAB");
  msg.set("PID-3.5", "MR");

  // PV1-3.1, the ward, becomes the lab's location code. A ward the table
  // does not know stops the message (dead-lettered, the error names the
  // line): sending the lab a location it cannot place is worse.
  var ward = msg.get("PV1-3.1");
  if (ward !== "") {
    var location = ctx.lookup("wards", ward);
    if (location === null) {
      throw new Error("ward code not in reference set wards; add it to reference/wards.csv");
    }
    msg.set("PV1-3.1", location);
  }

  // Admissions per patient, kept in transform state: the count travels to
  // the lab in a ZVC segment (set on a missing segment appends it).
  if (msg.get("MSH-9.2") === "A01") {
    var visits = (ctx.state.get("visits", mrn) || 0) + 1;
    ctx.state.set("visits", mrn, visits);
    msg.set("ZVC-1", visits);
  }
  // Returning nothing delivers msg, with the changes above, to the route's
  // destinations.
}

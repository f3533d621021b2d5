// Package hl7 parses, edits and re-encodes HL7 v2 messages and builds the
// acknowledgments the engine sends back to senders.
//
// A Message keeps every field in its encoded (escaped) form exactly as it
// arrived, and only splits a field into repetitions, components and
// subcomponents when a Path addresses inside it. That keeps Parse cheap, makes
// Parse→Encode of a well-formed message byte-identical, and means an edit
// touches only the field it addresses.
//
// Values are decoded (escape sequences resolved) when read with Get/Lookup
// and encoded again when written with Set, using the delimiters the message
// itself declares in MSH-1 and MSH-2.
//
// Message content is protected health information. Errors from this package
// name segment numbers, field positions, byte offsets and delimiter problems,
// never field values, and Message deliberately formats itself (fmt, slog)
// without content.
package hl7

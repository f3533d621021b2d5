package config

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Handlers and destinations come in kinds, each with its own options in a
// block named like its type (type: map comes with map:). The tables below are
// the only place that knows the kinds: adding one means adding a type
// constant, the fields its options decode into, and an entry here.

// handlerKind describes one type of handler.
type handlerKind struct {
	typ HandlerType
	// decode reads the options block; nil if the type takes none.
	decode func(l *loader, n *yaml.Node, p path, h *Handler)
	// check validates the decoded options once the whole file is decoded;
	// nil if there is nothing to check.
	check func(l *loader, h *Handler, p path)
	// example shows an options block, for the message when it's missing.
	example string
}

func handlerKinds() []handlerKind {
	return []handlerKind{
		{typ: HandlerPassthrough},
		{
			typ:     HandlerMap,
			decode:  decodeMapOps,
			check:   checkMapOps,
			example: "map: [{set: {path: MSH-5, value: LAB}}]",
		},
		{
			typ:     HandlerJavaScript,
			decode:  decodeJavaScript,
			check:   checkJavaScript,
			example: "javascript: {file: ./handlers/visits.js}",
		},
	}
}

// destinationKind describes one type of destination.
type destinationKind struct {
	typ DestinationType
	// decode reads the options block, which every destination type has.
	decode func(l *loader, n *yaml.Node, p path, d *Destination)
	// check validates the decoded options once the whole file is decoded.
	// The options are nil if the block was missing, which is already
	// reported.
	check func(l *loader, d *Destination, p path)
	// example shows an options block, for the message when it's missing.
	example string
}

func destinationKinds() []destinationKind {
	return []destinationKind{
		{
			typ:     DestinationMLLP,
			decode:  decodeMLLPDestination,
			check:   checkMLLPDestination,
			example: "mllp: {address: 127.0.0.1:2576}",
		},
		{
			typ:     DestinationFile,
			decode:  decodeFileDestination,
			check:   checkFileDestination,
			example: "file: {directory: ./out/archive}",
		},
		{
			typ:     DestinationHTTP,
			decode:  decodeHTTPDestination,
			check:   checkHTTPDestination,
			example: "http: {url: https://hie.example.org/hl7}",
		},
	}
}

func decodeMapOps(l *loader, n *yaml.Node, p path, h *Handler) {
	h.Map = []MapOp{} // given, even if empty: checkMapOps reports that
	for i, on := range l.sequence(n, p) {
		ip := p.index(i)
		m := l.mapping(on, ip, string(MapSet), string(MapCopy), string(MapClear), string(MapLookup))
		// An op that can't be decoded is kept with an empty Kind so that
		// the indexes of later ops still match the file.
		var op MapOp
		var kinds []string
		for _, k := range []MapOpKind{MapSet, MapCopy, MapClear, MapLookup} {
			if _, ok := m[string(k)]; ok {
				kinds = append(kinds, string(k))
				op.Kind = k
			}
		}
		switch {
		case len(kinds) > 1:
			l.errorf(ip, "has %s in one item; each edit is its own list item, e.g. - set: {...}", strings.Join(kinds, " and "))
			op.Kind = ""
		case len(kinds) == 0 && (isNull(on) || on.Kind == yaml.MappingNode && len(on.Content) == 0):
			// Items with only unknown keys were reported by mapping.
			l.errorf(ip, "is empty; write one of set, copy or clear, e.g. - set: {path: MSH-5, value: LAB}")
		}
		decodeMapOp(l, m, ip, &op)
		h.Map = append(h.Map, op)
	}
}

// decodeMapOp reads the arguments of op, whose Kind is set, from its list
// item m.
func decodeMapOp(l *loader, m map[string]*yaml.Node, p path, op *MapOp) {
	if op.Kind == "" {
		return
	}
	ap := p.key(string(op.Kind))
	switch op.Kind {
	case MapSet:
		am := l.mapping(m[string(MapSet)], ap, "path", "value")
		decodeScalar(l, am, ap, "path", &op.Target, asString)
		decodeScalar(l, am, ap, "value", &op.Value, asString)
	case MapCopy:
		am := l.mapping(m[string(MapCopy)], ap, "from", "to")
		decodeScalar(l, am, ap, "from", &op.From, asString)
		decodeScalar(l, am, ap, "to", &op.Target, asString)
	case MapClear:
		am := l.mapping(m[string(MapClear)], ap, "path")
		decodeScalar(l, am, ap, "path", &op.Target, asString)
	case MapLookup:
		decodeLookupOp(l, m, ap, op) // checked with the reference sets
	}
}

func checkMapOps(l *loader, h *Handler, p path) {
	mp := p.key(string(HandlerMap))
	if len(h.Map) == 0 && l.given(mp) {
		l.errorf(mp, "lists no edits; add at least one, e.g. - set: {path: MSH-5, value: LAB}")
	}
	for i, op := range h.Map {
		ap := mp.index(i).key(string(op.Kind))
		switch op.Kind {
		case MapSet:
			l.checkMapPath(ap, "path", op.Target, true)
			if !l.given(ap.key("value")) {
				l.errorf(ap.key("value"), "is required: the text to write (e.g. value: LAB; use clear to empty a field)")
			}
		case MapCopy:
			l.checkMapPath(ap, "from", op.From, false)
			l.checkMapPath(ap, "to", op.Target, true)
		case MapClear:
			l.checkMapPath(ap, "path", op.Target, true)
		}
	}
}

// checkMapPath checks the HL7 location at key k of a map edit.
func (l *loader) checkMapPath(p path, k, location string, written bool) {
	kp := p.key(k)
	if !l.given(kp) {
		l.errorf(kp, "is required: an HL7 location such as PID-3.1")
		return
	}
	loc, err := parseHL7Path(location)
	if err != nil {
		l.errorf(kp, "%q is not a valid HL7 location: %v", location, err)
		return
	}
	if why := loc.readOnly(); written && why != "" {
		l.errorf(kp, "%s can't be changed: %s", location, why)
	}
}

func decodeMLLPDestination(l *loader, n *yaml.Node, p path, d *Destination) {
	d.MLLP = &MLLPDestination{
		ConnectTimeout: defaultConnectTimeout,
		AckTimeout:     defaultAckTimeout,
		AEIsFailure:    true,
	}
	m := l.mapping(n, p, "address", "connect_timeout", "ack_timeout", "ae_is_failure", "tls", "plaintext")
	decodeScalar(l, m, p, "address", &d.MLLP.Address, asString)
	decodeScalar(l, m, p, "plaintext", &d.MLLP.Plaintext, parseBool)
	decodeScalar(l, m, p, "connect_timeout", &d.MLLP.ConnectTimeout, parseDuration)
	decodeScalar(l, m, p, "ack_timeout", &d.MLLP.AckTimeout, parseDuration)
	decodeScalar(l, m, p, "ae_is_failure", &d.MLLP.AEIsFailure, parseBool)
	if tn, ok := m["tls"]; ok {
		d.MLLP.TLS = l.decodeClientTLS(tn, p.key("tls"))
	}
}

func checkMLLPDestination(l *loader, d *Destination, p path) {
	if d.MLLP == nil {
		return
	}
	mp := p.key(string(DestinationMLLP))
	ap := mp.key("address")
	if !l.given(ap) {
		l.errorf(ap, "is required: the receiver's host:port (e.g. address: 127.0.0.1:2576)")
	} else if err := checkHostPort(d.MLLP.Address, true); err != nil {
		l.errorf(ap, "%q %v", d.MLLP.Address, err)
	}
	l.positive(mp, "connect_timeout", d.MLLP.ConnectTimeout, defaultConnectTimeout)
	l.positive(mp, "ack_timeout", d.MLLP.AckTimeout, defaultAckTimeout)
	l.checkOutboundTLS(d.MLLP, mp)
}

func decodeFileDestination(l *loader, n *yaml.Node, p path, d *Destination) {
	d.File = &FileDestination{Filename: DefaultFilename}
	m := l.mapping(n, p, "directory", "filename")
	decodeScalar(l, m, p, "directory", &d.File.Directory, asString)
	decodeScalar(l, m, p, "filename", &d.File.Filename, asString)
}

func checkFileDestination(l *loader, d *Destination, p path) {
	if d.File == nil {
		return
	}
	fp := p.key(string(DestinationFile))
	if d.File.Directory == "" {
		l.errorf(fp.key("directory"), "is required: where to write the files (e.g. directory: ./out/%s; relative to mefor's working directory)", d.Name)
	}
	np := fp.key("filename")
	tmpl, err := parseFilename(d.File.Filename)
	if err != nil {
		l.errorf(np, "%q is not a valid template: %v", d.File.Filename, errors.Unwrap(err))
		return
	}
	// Try the template now, so a misspelled field fails at load time
	// instead of on the first message.
	var b strings.Builder
	if err := tmpl.Execute(&b, sampleFileNameData(d.Name)); err != nil {
		l.errorf(np, "%q fails: %v; the fields are .MessageID .ControlID .Channel .MessageType .TriggerEvent .Destination .Seq .Received",
			d.File.Filename, err)
		return
	}
	if name := b.String(); !filepath.IsLocal(name) {
		l.errorf(np, "%q gives %q, which is empty, absolute or outside the directory; use a relative name such as %s",
			d.File.Filename, name, DefaultFilename)
		return
	}
	d.File.filename = tmpl
}

// checkHostPort checks a host:port address. The host may be empty (all
// interfaces) unless needHost is set.
func checkHostPort(addr string, needHost bool) error {
	if _, err := strconv.Atoi(addr); err == nil {
		if needHost {
			return fmt.Errorf("is only a port; write host:port, e.g. 127.0.0.1:%s", addr)
		}
		return fmt.Errorf("is only a port; write host:port, e.g. 127.0.0.1:%s, or :%s for all interfaces", addr, addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		var aerr *net.AddrError
		switch {
		case errors.As(err, &aerr) && aerr.Err == "missing port in address":
			return fmt.Errorf("needs a port, e.g. %s:2575", addr)
		case errors.As(err, &aerr) && aerr.Err == "too many colons in address":
			return errors.New("is not host:port; write IPv6 addresses in brackets, e.g. [::1]:2575")
		}
		return errors.New("is not host:port, e.g. 127.0.0.1:2575")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("has port %q; ports are numbers from 1 to 65535", port)
	}
	if needHost && host == "" {
		return fmt.Errorf("needs a host, e.g. 127.0.0.1:%s", port)
	}
	return nil
}

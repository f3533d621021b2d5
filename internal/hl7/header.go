package hl7

// Header holds the MSH values routing decides on, decoded.
type Header struct {
	SendingApplication   string // MSH-3.1
	SendingFacility      string // MSH-4.1
	ReceivingApplication string // MSH-5.1
	ReceivingFacility    string // MSH-6.1
	MessageType          string // MSH-9.1, e.g. ADT
	TriggerEvent         string // MSH-9.2, e.g. A01
	MessageStructure     string // MSH-9.3, e.g. ADT_A01
	ControlID            string // MSH-10
	ProcessingID         string // MSH-11.1: P, T or D
	Version              string // MSH-12.1, e.g. 2.5.1
}

// Header returns the routing values of the MSH segment.
func (m *Message) Header() Header {
	return Header{
		SendingApplication:   m.SendingApplication(),
		SendingFacility:      m.SendingFacility(),
		ReceivingApplication: m.ReceivingApplication(),
		ReceivingFacility:    m.ReceivingFacility(),
		MessageType:          m.MessageType(),
		TriggerEvent:         m.TriggerEvent(),
		MessageStructure:     m.msh(9, 3),
		ControlID:            m.ControlID(),
		ProcessingID:         m.ProcessingID(),
		Version:              m.Version(),
	}
}

// SendingApplication returns MSH-3.1.
func (m *Message) SendingApplication() string { return m.msh(3, 1) }

// SendingFacility returns MSH-4.1.
func (m *Message) SendingFacility() string { return m.msh(4, 1) }

// ReceivingApplication returns MSH-5.1.
func (m *Message) ReceivingApplication() string { return m.msh(5, 1) }

// ReceivingFacility returns MSH-6.1.
func (m *Message) ReceivingFacility() string { return m.msh(6, 1) }

// MessageType returns MSH-9.1, e.g. ADT.
func (m *Message) MessageType() string { return m.msh(9, 1) }

// TriggerEvent returns MSH-9.2, e.g. A01.
func (m *Message) TriggerEvent() string { return m.msh(9, 2) }

// ControlID returns MSH-10, the sender's id for this message, which its
// acknowledgment echoes in MSA-2.
func (m *Message) ControlID() string { return m.msh(10, 0) }

// ProcessingID returns MSH-11.1: P (production), T (training) or D
// (debugging).
func (m *Message) ProcessingID() string { return m.msh(11, 1) }

// Version returns MSH-12.1, e.g. 2.5.1.
func (m *Message) Version() string { return m.msh(12, 1) }

// msh returns component comp (0 for the whole field) of MSH field n.
func (m *Message) msh(n, comp int) string {
	return m.GetPath(Path{segment: "MSH", field: n, component: comp})
}

package hl7

import "strings"

// seg joins segments the way a well-formed message has them: each one
// terminated by CR.
func seg(lines ...string) string { return strings.Join(lines, "\r") + "\r" }

// Real-world message shapes. The patients are the HL7 standard's fictional
// ones.
var (
	adtA01 = seg(
		`MSH|^~\&|ADT1|GOOD HEALTH HOSPITAL|GHH LAB, INC.|GOOD HEALTH HOSPITAL|198808181126|SECURITY|ADT^A01^ADT_A01|MSG00001|P|2.5.1`,
		`EVN|A01|200708181123||`,
		`PID|1||PATID1234^^^GOOD HEALTH HOSPITAL^MR~123456789^^^USSSA^SS~987654^^^NC&2.16.840.1.113883.4.3.37&ISO^DL||EVERYMAN^ADAM^A^III||19610615|M||C|2222 HOME STREET^^GREENSBORO^NC^27401-1020|GL|(555) 555-2004|(555)555-2004||S||PATID12345001^2^M10^ADT1^AN^A|444333333|987654^NC`,
		`NK1|1|NUCLEAR^NELDA^W|SPO^SPOUSE||||NK^NEXT OF KIN`,
		`PV1|1|I|2000^2012^01||||004777^ATTEND^AARON^A|||SUR||||ADM|A0|`,
	)

	oruR01 = seg(
		`MSH|^~\&|GHH LAB|ELAB-3|GHH OE|BLDG4|200202150930||ORU^R01^ORU_R01|CNTRL-3456|P|2.4`,
		`PID|||555-44-4444||EVERYWOMAN^EVE^E^^^^L|JONES|19620320|F|||153 FERNWOOD DR.^^STATESVILLE^OH^35292||(206)3345232|(206)752-121||||AC555444444||67-A4335^OH^20030520`,
		`OBR|1|845439^GHH OE|1045813^GHH LAB|15545^GLUCOSE|||200202150730|||||||||555-55-5555^PRIMARY^PATRICIA P^^^^MD^^|||||||||F||||||444-44-4444^HIPPOCRATES^HOWARD H^^^^MD`,
		`OBX|1|SN|1554-5^GLUCOSE^POST 12H CFST:MCNC:PT:SER/PLAS:QN||^182|mg/dl|70_105|H|||F`,
		`OBX|2|NM|2345-7^GLUCOSE^LN||95|mg/dL|70-99||||F|||200202150800`,
		`OBX|3|NM|2823-3^POTASSIUM^LN||4.1|mmol/L|3.5-5.1||||F`,
		`OBX|4|TX|NOTE^COMMENT^L||Sample hemolyzed \T\ re-drawn\X0D\\X0A\Result: 5 \S\ 6 \F\ ok \.br\next||||||F`,
		`OBX|5|ST|FLAG^FLAG^L||A~B~C||||||F`,
		`NTE|1||Reviewed by lab`,
		`ZPD|1|custom^z^segment|`,
	)

	// nonDefault uses # as field separator and *@!% as component,
	// repetition, escape and subcomponent.
	nonDefault = seg(
		`MSH#*@!%#SENDER*1.2.3*ISO#FAC#RECV#RFAC#20240102030405##ADT*A08*ADT_A01#CTRL-77#T#2.3`,
		`PID#1##ID1*1*2*AUTH@ID2*3#!F!weird!S!name#DOE*JANE%X`,
	)

	// v27 declares the v2.7 truncation character.
	v27 = seg(
		`MSH|^~\&#|APP|FAC|RAPP|RFAC|20240102030405||ADT^A04^ADT_A01|C1|P|2.7`,
		`PID|1||ID1||LONG\P\NAME`,
	)
)

// wellFormed are messages Parse→Encode must reproduce byte for byte.
var wellFormed = map[string]string{
	"adt a01":     adtA01,
	"oru r01":     oruR01,
	"non-default": nonDefault,
	"v2.7":        v27,
	"msh only":    seg(`MSH|^~\&|A|B|C|D|20240101||ACK|1|P|2.5`),
	"empty trailing fields": seg(
		`MSH|^~\&|||||||ADT^A01|1||2.5|||`,
		`PV1||||`,
		`ZZZ`,
	),
}

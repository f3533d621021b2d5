// Package egress decides where mefor may connect: the `egress.allow` list
// of a config, checked once against every host the config names and again
// against the address of every connection made.
//
// # The model
//
// A List holds entries: a host name, "*.domain" (any name below domain),
// an address or a CIDR, each optionally with a port. A List alone answers
// the static question "may the config name this host and port?"
// (List.Allows): a host name must be listed by name or by a wildcard, an
// address by an address or a CIDR. config applies it to every destination,
// reference-set source, alert webhook and proxy, so a typo is an error of
// `mefor config check`, `mefor reload` and a node's start, never a
// connection.
//
// A Policy is a List with the addresses of the host names the config
// connects to, resolved when it is built (a node's start and each reload)
// and pinned. Every connection goes through a Policy's Dialer, whose
// net.Dialer control hook sees the address actually dialled, after any
// resolution, and lets it through only if it is inside a listed address
// or CIDR, or is one of the pinned addresses of a listed name. So a DNS
// answer that changed after the config was loaded cannot redirect data:
// the connection is refused before a byte is written, with a
// RefusedError naming the target and the address, and counted by the
// caller (Options.OnRefuse). A name that did not resolve when the policy
// was built is pinned at its first connection.
//
// Names whose addresses rotate by design (a cloud service behind several
// changing addresses) need their network listed as a CIDR; a planned move
// of a host needs a reload, which resolves every name again.
//
// # Proxies
//
// An HTTP client (Policy.HTTPClient) uses a proxy only when one is given,
// never from the environment. Through a proxy the connection made is to
// the proxy, so it is the proxy's address that is checked at connect
// time; the host behind it was checked statically by config and is
// resolved by the proxy.
//
// # Reuse
//
// A nil *Policy connects anywhere: the config has no egress: section.
// Every outbound connection mefor makes (MLLP and HTTP destinations, HTTP
// and SQL reference sources, alert webhooks) dials through a Policy, and
// so must any new one (the SSO issuer, SFTP): list its host in
// config's outbound connections so it is checked statically and pinned,
// and dial through Policy.Dialer or Policy.HTTPClient.
package egress

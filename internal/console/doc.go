// Package console is mefor's operator console: server-rendered pages on
// the API's listener at / (the api package mounts it through
// api.Config.Console), for the people who run interfaces.
//
// The console is the API's first client. Every page reads and acts by
// calling the API's own handler in process, with the browser's session
// cookie, its source address and (for writes) the session's CSRF token,
// so the API's rules hold on every page without being restated here:
// permissions, channel scope (a message out of scope is the API's 404,
// and the page's), the audit rows of body views and searches, dual
// control. The console only decides what to show: a button whose
// permission the person lacks is not rendered.
//
// Pages are html/template, their CSS and a little plain JavaScript are
// embedded (go:embed), and every page works read-only with JavaScript
// off; the script only refreshes the dashboard from GET /api/v1/status
// and shows times in the browser's zone. The Content-Security-Policy
// allows scripts from the console's own /static/ only, never inline.
//
// Patient identifiers and message content never go into a URL or a page
// title: a patient or text search is a POSTed form, a body is shown in
// answer to a POST, and both pages are sent with Cache-Control: no-store.
package console

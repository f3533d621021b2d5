// Package notify sends one alert notification to one sink: a webhook POST,
// a mail over SMTP, a syslog message, or a line of the node's log. The
// alert notification worker (workers.AlertNotifyWorker) and `mefor alerts
// test` both send through Sender.Send, so a test notification takes the
// path a real one does: the same egress policy, TLS configuration and
// credentials.
//
// A notification holds rule names, what a rule watches (a destination, a
// channel, an audit.forward target), conditions, counts and times; never
// message content, which an evaluation never reads. Secrets (webhook
// header values, the SMTP password) are read from the config at send time
// and never logged, recorded or put into an error; errors name the
// receiver's host and the step that failed.
package notify

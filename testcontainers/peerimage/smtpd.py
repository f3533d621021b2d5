"""An SMTP server for tests: Debian's python3-aiosmtpd with STARTTLS and
AUTH, which its command line cannot set up.

Usage: python3 smtpd.py PORT CERT KEY USER PASSWORD OUT
  Listens on 0.0.0.0:PORT, offers STARTTLS with CERT/KEY and requires it
  before anything else, requires AUTH (PLAIN or LOGIN) as USER/PASSWORD,
  and appends each mail it accepts to OUT as one JSON line:
  {"from": ..., "to": [...], "user": ..., "data": ...}.
  An empty CERT serves plaintext (no STARTTLS); an empty USER takes mail
  without AUTH.
"""
import json
import ssl
import sys
import threading

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

port, cert, key, user, password, out = sys.argv[1:7]
lock = threading.Lock()


class Handler:
    async def handle_DATA(self, server, session, envelope):
        who = getattr(session, "mefor_user", None)
        line = json.dumps({"from": envelope.mail_from, "to": envelope.rcpt_tos, "user": who,
                           "data": envelope.content.decode("utf-8", "replace")})
        with lock, open(out, "a") as f:
            f.write(line + "\n")
        return "250 OK"


def authenticator(server, session, envelope, mechanism, auth_data):
    ok = (isinstance(auth_data, LoginPassword) and auth_data.login.decode() == user
          and auth_data.password.decode() == password)
    if ok:
        session.mefor_user = user
    # handled=False: aiosmtpd answers 535 itself (it defaults to True,
    # which leaves the client waiting).
    return AuthResult(success=ok, handled=False)


kwargs = {}
if cert:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    kwargs.update(tls_context=ctx, require_starttls=True)
if user:
    kwargs.update(authenticator=authenticator, auth_required=True, auth_require_tls=bool(cert))

open(out, "a").close()
controller = Controller(Handler(), hostname="0.0.0.0", port=int(port), server_hostname="smtp.test", **kwargs)
controller.start()
print("smtpd ready", flush=True)
threading.Event().wait()

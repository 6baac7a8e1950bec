"""The string formats radixlm writes itself, as regexes of the JSON string (quotes included).

outlines-core's own versions let invalid outputs through (dates like 2023-02-30 and year 0000, a
time without offset, an email with a quoted local part or a trailing dot, a URI with a bare `%`
or a `"` that ends the JSON string early). Each regex here produces only values that the format's
reference checker accepts: `date.fromisoformat` and RFC 3339 (date, time, date-time: leap years
included, an offset required), RFC 3986 (uri: `%` only as `%XX`), RFC 5322 dot-atom (email), and
Python's `ipaddress` / `uuid`. Each is narrower than its format (not every valid value can be
produced). Constants only.
"""

from __future__ import annotations

_TIME = (
    r"(2[0-3]|[01][0-9]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-](2[0-3]|[01][0-9]):[0-5][0-9])"
)
# Years 0001-9999 (`date.fromisoformat` refuses 0000); leap years: multiples of 4 except
# centuries, and centuries that are multiples of 400.
_YEAR = r"(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"
_LEAP_YEAR = r"([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"({_YEAR}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
    rf"|02-(0[1-9]|1[0-9]|2[0-8]))|{_LEAP_YEAR}-02-29)"
)
_IPV4_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_HEX = "[0-9a-fA-F]"
_URI_CHAR = rf"([a-zA-Z0-9._~!$&'()*+,;=:@/-]|%{_HEX}{{2}})"
# RFC 5322 dot-atom (no leading, trailing or doubled dot; at most 64 characters) and RFC 1035
# labels (no leading or trailing hyphen).
_ATOM = r"[a-zA-Z0-9_+-]{1,20}"
_LABEL = r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,30}[a-zA-Z0-9])?"

OWN_FORMATS = {
    "date": f'"{_DATE}"',
    "time": f'"{_TIME}"',
    "date-time": f'"{_DATE}T{_TIME}"',
    "ipv4": f'"({_IPV4_OCTET}\\.){{3}}{_IPV4_OCTET}"',
    "uuid": f'"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"',
    "email": rf'"{_ATOM}(\.{_ATOM}){{0,2}}@{_LABEL}(\.{_LABEL}){{0,2}}\.[a-zA-Z]{{2,24}}"',
    "uri": (
        rf'"(https?|ftp)://[a-zA-Z0-9.-]{{1,253}}(:[0-9]{{1,5}})?(/{_URI_CHAR}*)?'
        rf'(\?{_URI_CHAR}*)?(#{_URI_CHAR}*)?"'
    ),
}
SUPPORTED_FORMATS = tuple(OWN_FORMATS)

//! The replicas' addresses as users write them: `host:port`, as coord has always taken them, or
//! a URL, `http://host:port` or `https://host:port` (a trailing `/` allowed), as etcdctl and most
//! gRPC tools take them. A client turns what it was given into `host:port` here, once, so that
//! the address it dials, the one it matches a leader hint against and the one its errors print
//! are the same string.
//!
//! A URL's scheme is a promise about the transport, `https://` TLS and `http://` plain gRPC, and
//! it is checked against the TLS configuration rather than quietly overridden by it: there is no
//! system trust store to fall back on (the ensemble's own CA signs its certificates), so
//! `https://` without that CA cannot be kept, and `http://` with it would not mean what it says.

/// The transport an endpoint asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// `host:port`: whatever the TLS configuration says.
    Unspecified,
    /// `http://host:port`: plain gRPC.
    Plain,
    /// `https://host:port`: TLS.
    Tls,
}

/// One endpoint as given, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSpec {
    /// `host:port` (an IPv6 host in brackets): what a client dials and prints.
    pub addr: String,
    pub transport: Transport,
}

/// An endpoint that cannot be used, named as the user wrote it, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("endpoint {endpoint:?}: {why}")]
pub struct EndpointError {
    pub endpoint: String,
    pub why: String,
}

/// What a malformed endpoint is told it should have been.
const FORMS: &str = "expected host:port, http://host:port or https://host:port";

/// Parses one endpoint: `host:port`, `http://host:port` or `https://host:port`. Anything else (a
/// scheme other than http/https, a path, user information, no port) is refused, naming it.
pub fn parse_endpoint(given: &str) -> Result<EndpointSpec, EndpointError> {
    let bad = |why: String| EndpointError {
        endpoint: given.to_string(),
        why,
    };
    // Spaces around a comma-separated list's items are the shell's, not the address's.
    let text = given.trim();
    let (transport, rest) = match text.split_once("://") {
        None => (Transport::Unspecified, text),
        Some((scheme, rest)) => {
            let transport = match scheme.to_ascii_lowercase().as_str() {
                "http" => Transport::Plain,
                "https" => Transport::Tls,
                _ => return Err(bad(format!("unsupported scheme {scheme:?}; {FORMS}"))),
            };
            (transport, rest.strip_suffix('/').unwrap_or(rest))
        }
    };
    let addr = authority(rest).map_err(|why| bad(format!("{why}; {FORMS}")))?;
    Ok(EndpointSpec { addr, transport })
}

/// `host:port` checked and written back (the port without leading zeros), or why it is not one.
fn authority(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("no address".into());
    }
    if let Some(at) = text.find(['/', '?', '#']) {
        return Err(format!("a path ({:?}) is not allowed", &text[at..]));
    }
    if text.contains('@') {
        return Err("user information (user@) is not allowed".into());
    }
    let (host, port) = if text.starts_with('[') {
        ipv6_host(text)?
    } else {
        let (host, port) = text.rsplit_once(':').ok_or("no port")?;
        name_host(host)?;
        (host, port)
    };
    Ok(format!("{host}:{}", port_number(port)?))
}

/// `[v6]:port`'s host (brackets kept: `host:port` needs them) and port.
fn ipv6_host(text: &str) -> Result<(&str, &str), String> {
    let close = text
        .find(']')
        .ok_or("an unclosed '[' (an IPv6 address is written [::1]:7101)")?;
    let (host, after) = text.split_at(close + 1);
    let inside = &host[1..close];
    let v6 = |c: char| c.is_ascii_hexdigit() || c == ':' || c == '.';
    if !inside.contains(':') || !inside.chars().all(v6) {
        return Err(format!("{host} is not an IPv6 address"));
    }
    let port = after
        .strip_prefix(':')
        .ok_or("no port after the IPv6 address")?;
    Ok((host, port))
}

/// Checks a host name or IPv4 address: letters, digits, `-`, `.` and `_`.
fn name_host(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err("no host".into());
    }
    if host.contains(':') {
        return Err("more than one ':' (an IPv6 address is written [::1]:7101)".into());
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    match host.chars().find(|c| !allowed(*c)) {
        Some(c) => Err(format!("{c:?} in host {host:?}")),
        None => Ok(()),
    }
}

/// A port, 1 to 65535, in decimal digits only (`u16`'s parser would take `+80`).
fn port_number(port: &str) -> Result<u16, String> {
    let number = (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
        .then(|| port.parse::<u16>().ok())
        .flatten()
        .filter(|p| *p != 0);
    match (port.is_empty(), number) {
        (true, _) => Err("no port".into()),
        (false, Some(p)) => Ok(p),
        (false, None) => Err(format!("port {port:?} is not a number from 1 to 65535")),
    }
}

/// The addresses (`host:port`) of `endpoints`, each parsed and all checked against each other
/// and against whether TLS is configured (`tls`). Every refusal names the endpoint as given and,
/// where a flag would fix it, the flag.
pub fn endpoint_addrs(endpoints: &[String], tls: bool) -> Result<Vec<String>, EndpointError> {
    let specs = endpoints
        .iter()
        .map(|e| parse_endpoint(e).map(|spec| (e, spec)))
        .collect::<Result<Vec<_>, _>>()?;
    let first = |t: Transport| {
        specs
            .iter()
            .find(|(_, s)| s.transport == t)
            .map(|(e, _)| *e)
    };
    if let (Some(plain), Some(secure)) = (first(Transport::Plain), first(Transport::Tls)) {
        return Err(EndpointError {
            endpoint: plain.clone(),
            why: format!(
                "http:// (plain gRPC) beside {secure:?} (https://, TLS): every endpoint must use the same scheme"
            ),
        });
    }
    let refuse = |given: &String, why: &str| {
        Err(EndpointError {
            endpoint: given.clone(),
            why: why.to_string(),
        })
    };
    for (given, spec) in &specs {
        match (spec.transport, tls) {
            (Transport::Tls, false) => refuse(
                given,
                "https:// needs TLS, and none is configured: add --tls-ca with the ensemble's CA certificate (no system trust store stands in for it)",
            )?,
            (Transport::Plain, true) => refuse(
                given,
                "http:// asks for plain gRPC, but TLS is configured (--tls-ca): write https:// or host:port",
            )?,
            _ => {}
        }
    }
    Ok(specs.into_iter().map(|(_, s)| s.addr).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(addr: &str, transport: Transport) -> Result<EndpointSpec, EndpointError> {
        Ok(EndpointSpec {
            addr: addr.into(),
            transport,
        })
    }

    #[test]
    fn addresses_and_urls_parse_to_host_and_port() {
        use Transport::*;
        for (given, want) in [
            ("127.0.0.1:7101", spec("127.0.0.1:7101", Unspecified)),
            ("http://127.0.0.1:7101", spec("127.0.0.1:7101", Plain)),
            ("http://127.0.0.1:7101/", spec("127.0.0.1:7101", Plain)),
            (
                "HTTPS://coord-0.coord:7101/",
                spec("coord-0.coord:7101", Tls),
            ),
            (" localhost:7101 ", spec("localhost:7101", Unspecified)),
            ("https://[::1]:7101", spec("[::1]:7101", Tls)),
            ("[fe80::1]:07101", spec("[fe80::1]:7101", Unspecified)),
        ] {
            assert_eq!(parse_endpoint(given), want, "{given}");
        }
    }

    #[test]
    fn malformed_endpoints_are_named_with_the_reason() {
        for (given, why) in [
            ("ftp://h:1", "unsupported scheme \"ftp\""),
            ("unix:///tmp/coord.sock", "unsupported scheme \"unix\""),
            ("://h:1", "unsupported scheme \"\""),
            ("http://h:1/v3", "a path (\"/v3\") is not allowed"),
            ("h:1/", "a path (\"/\") is not allowed"),
            ("http://h:1//", "a path"),
            ("http://h:1?x=1", "a path"),
            ("http://u@h:1", "user information"),
            ("http://h", "no port"),
            ("h:", "no port"),
            ("localhost", "no port"),
            ("", "no address"),
            ("http://", "no address"),
            (":7101", "no host"),
            ("h:1:2", "more than one ':'"),
            ("::1:7101", "more than one ':'"),
            ("[::1:7101", "an unclosed '['"),
            ("[::1]", "no port after the IPv6 address"),
            ("[h]:1", "[h] is not an IPv6 address"),
            ("h:+80", "port \"+80\" is not a number"),
            ("h:0", "port \"0\" is not a number"),
            ("h:65536", "port \"65536\""),
            ("h é:1", "in host"),
        ] {
            let err = parse_endpoint(given).expect_err(given);
            assert_eq!(err.endpoint, given);
            let text = err.to_string();
            assert!(text.contains(why), "{given}: {text}");
            assert!(text.starts_with(&format!("endpoint {given:?}")), "{text}");
        }
    }

    fn list(endpoints: &[&str]) -> Vec<String> {
        endpoints.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn schemes_agree_with_each_other_and_with_the_tls_configuration() {
        let plain = list(&["http://a:1", "b:2"]);
        assert_eq!(endpoint_addrs(&plain, false), Ok(list(&["a:1", "b:2"])));
        let secure = list(&["https://a:1/", "b:2"]);
        assert_eq!(endpoint_addrs(&secure, true), Ok(list(&["a:1", "b:2"])));
        let bare = list(&["a:1"]);
        assert_eq!(endpoint_addrs(&bare, true), Ok(list(&["a:1"])));

        let err = endpoint_addrs(&list(&["b:2", "https://a:1"]), false).expect_err("no CA");
        assert_eq!(err.endpoint, "https://a:1");
        assert!(err.why.contains("--tls-ca"), "{err}");
        let err = endpoint_addrs(&list(&["http://a:1"]), true).expect_err("TLS configured");
        assert_eq!(err.endpoint, "http://a:1");
        assert!(err.why.contains("--tls-ca"), "{err}");
        for tls in [false, true] {
            let err = endpoint_addrs(&list(&["https://a:1", "http://b:2"]), tls)
                .expect_err("a mix of schemes");
            assert_eq!(err.endpoint, "http://b:2");
            assert!(err.why.contains("\"https://a:1\""), "{err}");
            assert!(err.why.contains("same scheme"), "{err}");
        }
        // A malformed endpoint is reported before any question of schemes.
        let err = endpoint_addrs(&list(&["https://a:1", "b"]), false).expect_err("no port");
        assert_eq!(err.endpoint, "b");
    }

    /// Random endpoints never panic the parser; what it accepts is `host:port` that it parses
    /// again to itself, that tonic takes as a URL's authority, and that the URL forms of the same
    /// address parse to.
    #[test]
    fn fuzz_endpoints() {
        let mut next = crate::fuzz::xorshift(0xE4D_9017);
        // An endpoint's parts in order, each drawn from its own pieces (some of them wrong), so
        // that many draws are near misses of a valid endpoint.
        let parts: [&[&str]; 5] = [
            &[
                "", "", "http://", "https://", "HTTP://", "ftp://", ":/", " ",
            ],
            &[
                "h", "10.0.0.1", "[::1]", "[", "::1", "a-b.c_d", "", "é", "u@h",
            ],
            &[":", ":", ":", "", "]:", "::"],
            &["7101", "1", "65535", "0", "99999", "+1", "", "x"],
            &["", "", "", "/", "//", "/v3", "?", "#", " ", ":1"],
        ];
        let mut accepted = 0;
        for _ in 0..20_000 {
            let given: String = parts
                .iter()
                .map(|p| p[(next() % p.len() as u64) as usize])
                .collect();
            let Ok(parsed) = parse_endpoint(&given) else {
                continue;
            };
            accepted += 1;
            let again = parse_endpoint(&parsed.addr).expect(&parsed.addr);
            assert_eq!(again.addr, parsed.addr, "{given:?}");
            for scheme in ["http", "https"] {
                let url = format!("{scheme}://{}/", parsed.addr);
                assert_eq!(
                    parse_endpoint(&url).map(|s| s.addr),
                    Ok(parsed.addr.clone())
                );
                tonic::transport::Endpoint::from_shared(url.clone())
                    .unwrap_or_else(|e| panic!("{given:?} -> {url}: tonic refuses it: {e}"));
            }
        }
        assert!(
            accepted > 100,
            "only {accepted} accepted: the pieces are too random"
        );
    }
}

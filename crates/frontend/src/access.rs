//! Who may use which export, and how: per-export allow-lists by client
//! certificate identity, and read-only exports.
//!
//! Owns: [`ExportAccess`] (an export's rules), [`ClientIdentity`] (the names
//! a verified client certificate carries: its subject's common names and
//! its DNS subject-alternative names), and the decision [`decide`].
//!
//! Invariants: an identity comes only from a certificate the TLS layer
//! verified against the configured client CA (mutual TLS); without one a
//! client has no identity, and an export with any allow-list refuses it.
//! An entry matches a name exactly (case-sensitive, no wildcards), so a
//! list means what it says. A client on `allow_read_only` but not on
//! `allow` gets a read-only session; a read-only export is read-only for
//! everyone.
//!
//! Why names and not full distinguished names (qemu's `tls-authz` matches
//! the whole DN string): the CN and DNS names are what operators put in
//! certificates and type in configs; a DN's spelling (order, escaping)
//! differs between tools.

use std::fmt;

use rustls::pki_types::CertificateDer;

/// An export's access rules. The default lets every client read and write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportAccess {
    /// Every client is refused writes (EPERM) and told the export is
    /// read-only.
    pub read_only: bool,
    /// Identities with full access. Empty, with `allow_read_only` empty
    /// too: any client.
    pub allow: Vec<String>,
    /// Identities with read-only access.
    pub allow_read_only: Vec<String>,
}

/// What a client may do with an export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    ReadWrite,
    ReadOnly,
    Refused,
}

/// The names of a verified client certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientIdentity {
    pub names: Vec<String>,
}

impl fmt::Display for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.names.is_empty() {
            return f.write_str("(no name)");
        }
        f.write_str(&self.names.join(", "))
    }
}

impl ClientIdentity {
    /// The subject CNs and DNS SANs of an end-entity certificate; None if
    /// it does not parse (the TLS layer verified it, so it will).
    pub fn of(cert: &CertificateDer<'_>) -> Option<ClientIdentity> {
        let ee = webpki::EndEntityCert::try_from(cert).ok()?;
        let mut names = common_names(ee.subject())?;
        names.extend(ee.valid_dns_names().map(str::to_owned));
        names.dedup();
        Some(ClientIdentity { names })
    }
}

/// The decision for a client (`None`: no verified certificate).
pub fn decide(access: &ExportAccess, client: Option<&ClientIdentity>) -> Grant {
    let listed = |list: &[String]| client.is_some_and(|c| c.names.iter().any(|n| list.contains(n)));
    let open = access.allow.is_empty() && access.allow_read_only.is_empty();
    let grant = if open || listed(&access.allow) {
        Grant::ReadWrite
    } else if listed(&access.allow_read_only) {
        Grant::ReadOnly
    } else {
        Grant::Refused
    };
    match grant {
        Grant::ReadWrite if access.read_only => Grant::ReadOnly,
        g => g,
    }
}

/// One DER element: (tag, contents, rest).
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, &b| a << 8 | b as usize);
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The commonName (2.5.4.3) values of a DER Name's contents (the
/// RDNSequence without its outer SEQUENCE header).
fn common_names(mut rdns: &[u8]) -> Option<Vec<String>> {
    const SET: u8 = 0x31;
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    const CN: &[u8] = &[0x55, 0x04, 0x03];
    let mut out = Vec::new();
    while !rdns.is_empty() {
        let (tag, mut set, rest) = der(rdns)?;
        rdns = rest;
        if tag != SET {
            return None;
        }
        while !set.is_empty() {
            let (tag, atv, rest) = der(set)?;
            set = rest;
            if tag != SEQUENCE {
                return None;
            }
            let (tag, oid, value) = der(atv)?;
            let (vtag, v, _) = der(value)?;
            // UTF8String, PrintableString, IA5String (T61 and BMP are not
            // used for names any CA issues now).
            if tag == OID && oid == CN && matches!(vtag, 0x0c | 0x13 | 0x16) {
                out.push(String::from_utf8(v.to_vec()).ok()?);
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(names: &[&str]) -> ClientIdentity {
        ClientIdentity { names: names.iter().map(|s| s.to_string()).collect() }
    }

    #[test]
    fn allow_lists_and_read_only_decide_the_grant() {
        let open = ExportAccess::default();
        assert_eq!(decide(&open, None), Grant::ReadWrite);
        let ro = ExportAccess { read_only: true, ..Default::default() };
        assert_eq!(decide(&ro, Some(&id(&["a"]))), Grant::ReadOnly);
        let listed = ExportAccess {
            read_only: false,
            allow: vec!["alice".into()],
            allow_read_only: vec!["carol".into(), "backup.example".into()],
        };
        assert_eq!(decide(&listed, None), Grant::Refused);
        assert_eq!(decide(&listed, Some(&id(&["alice"]))), Grant::ReadWrite);
        assert_eq!(decide(&listed, Some(&id(&["carol"]))), Grant::ReadOnly);
        assert_eq!(decide(&listed, Some(&id(&["x", "backup.example"]))), Grant::ReadOnly);
        assert_eq!(decide(&listed, Some(&id(&["Alice"]))), Grant::Refused, "exact match only");
        assert_eq!(decide(&listed, Some(&id(&[]))), Grant::Refused);
        let both = ExportAccess { read_only: true, ..listed };
        assert_eq!(decide(&both, Some(&id(&["alice"]))), Grant::ReadOnly);
    }

    /// A Name with O and two CNs, one PrintableString, one UTF8String.
    #[test]
    fn common_names_are_read_from_a_der_name() {
        let atv = |oid: &[u8], tag: u8, v: &str| {
            let mut s = vec![0x06, oid.len() as u8];
            s.extend_from_slice(oid);
            s.extend_from_slice(&[tag, v.len() as u8]);
            s.extend_from_slice(v.as_bytes());
            let mut seq = vec![0x30, s.len() as u8];
            seq.extend(s);
            let mut set = vec![0x31, seq.len() as u8];
            set.extend(seq);
            set
        };
        let name =
            [atv(&[0x55, 4, 10], 0x0c, "Org"), atv(&[0x55, 4, 3], 0x13, "alice"), atv(&[0x55, 4, 3], 0x0c, "ålice")]
                .concat();
        assert_eq!(common_names(&name).unwrap(), vec!["alice".to_string(), "ålice".to_string()]);
        assert_eq!(common_names(&name[..name.len() - 1]), None, "truncated");
        assert_eq!(common_names(&[]).unwrap(), Vec::<String>::new());
    }
}

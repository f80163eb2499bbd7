//! ACL decisions: whether a client may publish to a topic, subscribe to a
//! filter, or receive a message, by the rules the ACL file gives (the
//! matching rules are documented with the file's syntax in
//! [`crate::config::auth`]).

use std::sync::Arc;

use crate::config::auth::{AclFile, Grant};
use crate::topic::filter_covers;

/// What a client asks to do with a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Subscribe to it / receive it.
    Read,
    /// Publish to it.
    Write,
}

/// Whether `grant` gives `access`.
fn grants(grant: Grant, access: Access) -> bool {
    matches!(
        (grant, access),
        (Grant::ReadWrite, _) | (Grant::Read, Access::Read) | (Grant::Write, Access::Write)
    )
}

/// Whether the client (`user` `None` when anonymous) may `access`
/// `topic`. `topic` is a topic name for a publish or a delivery, or the
/// filter of a SUBSCRIBE: a filter is allowed when a grant covers all of
/// it and no deny covers it; each message delivered through it should
/// be checked again by topic name.
pub fn allows(
    acl: &AclFile,
    user: Option<&str>,
    client_id: &str,
    topic: &str,
    access: Access,
) -> bool {
    let rules = acl.rules();
    let user_rules = user
        .and_then(|u| rules.users.get(u))
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let mut granted = false;
    for rule in rules.everyone.iter().chain(user_rules) {
        if filter_covers(&rule.filter, topic) {
            if rule.grant == Grant::Deny {
                return false;
            }
            granted |= grants(rule.grant, access);
        }
    }
    for rule in &rules.patterns {
        match substitute(&rule.filter, user, client_id) {
            Substituted::Filter(filter) => {
                if filter_covers(&filter, topic) {
                    if rule.grant == Grant::Deny {
                        return false;
                    }
                    granted |= grants(rule.grant, access);
                }
            }
            // An anonymous client has no %u: the pattern is not about it.
            Substituted::NotApplicable => {}
            // Fail closed: a deny that a crafted id could dodge denies.
            Substituted::Unsafe if rule.grant == Grant::Deny => return false,
            Substituted::Unsafe => {}
        }
    }
    granted
}

enum Substituted {
    Filter(String),
    /// `%u` for an anonymous client.
    NotApplicable,
    /// A value containing `/`, `+` or `#` would change the filter's shape.
    Unsafe,
}

/// `%u` and `%c` replaced.
fn substitute(filter: &str, user: Option<&str>, client_id: &str) -> Substituted {
    let unsafe_value = |v: &str| v.contains(['/', '+', '#']);
    let mut out = filter.to_string();
    if filter.contains("%u") {
        let Some(user) = user else {
            return Substituted::NotApplicable;
        };
        if unsafe_value(user) {
            return Substituted::Unsafe;
        }
        out = out.replace("%u", user);
    }
    if filter.contains("%c") {
        if unsafe_value(client_id) {
            return Substituted::Unsafe;
        }
        out = out.replace("%c", client_id);
    }
    Substituted::Filter(out)
}

/// The ACL file in force (a SIGHUP may replace it) as the state's
/// [`Authorizer`](crate::broker::state::Authorizer).
pub struct AclAuthorizer(pub Arc<crate::broker::auth_files::Reloadable<AclFile>>);

impl crate::broker::state::Authorizer for AclAuthorizer {
    fn is_active(&self) -> bool {
        true
    }
    fn can_publish(&self, principal: Option<&str>, client_id: &str, topic: &str) -> bool {
        allows(
            &self.0.current(),
            principal,
            client_id,
            topic,
            Access::Write,
        )
    }
    fn can_subscribe(&self, principal: Option<&str>, client_id: &str, filter: &str) -> bool {
        allows(
            &self.0.current(),
            principal,
            client_id,
            filter,
            Access::Read,
        )
    }
    fn can_receive(&self, principal: Option<&str>, client_id: &str, topic: &str) -> bool {
        allows(&self.0.current(), principal, client_id, topic, Access::Read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACL: &str = "\
# everyone
topic read public/#
topic deny public/private

user alice
topic readwrite alice/#
topic write shared/in
topic deny alice/secret

user bob
topic bob/+/x

pattern write devices/%c/out
pattern read users/%u/#
";

    #[test]
    fn acl_rules_apply_to_the_right_clients() {
        let acl = AclFile::parse(ACL).unwrap();
        assert_eq!(acl.rule_count(), 8);
        use Access::*;
        // Lines before any user apply to everyone, anonymous included.
        assert!(allows(&acl, None, "c1", "public/news", Read));
        assert!(allows(&acl, Some("bob"), "c1", "public/news", Read));
        assert!(!allows(&acl, None, "c1", "public/news", Write));
        assert!(!allows(&acl, Some("alice"), "c1", "public/private", Read));
        // User sections.
        assert!(allows(&acl, Some("alice"), "c1", "alice/a/b", Write));
        assert!(allows(&acl, Some("alice"), "c1", "alice", Read));
        assert!(!allows(&acl, Some("alice"), "c1", "alice/secret", Read));
        assert!(allows(&acl, Some("alice"), "c1", "shared/in", Write));
        assert!(!allows(&acl, Some("alice"), "c1", "shared/in", Read));
        assert!(!allows(&acl, Some("bob"), "c1", "alice/a", Read));
        assert!(allows(&acl, Some("bob"), "c1", "bob/q/x", Write));
        assert!(!allows(&acl, Some("bob"), "c1", "bob/q/y", Write));
        // Patterns apply to everyone, substituted.
        assert!(allows(&acl, None, "dev7", "devices/dev7/out", Write));
        assert!(!allows(&acl, None, "dev7", "devices/dev8/out", Write));
        assert!(allows(&acl, Some("carol"), "x", "users/carol/inbox", Read));
        assert!(!allows(&acl, None, "x", "users/carol/inbox", Read));
        // A client id that would widen a pattern does not match it.
        assert!(!allows(&acl, None, "+", "devices/anything/out", Write));
        assert!(!allows(&acl, None, "a/b", "devices/a/b/out", Write));
        // Subscription filters: covered or not.
        assert!(allows(&acl, None, "c", "public/+", Read));
        assert!(!allows(&acl, None, "c", "#", Read));
        assert!(!allows(&acl, Some("alice"), "c", "alice/secret", Read));
    }

    #[test]
    fn a_deny_pattern_that_cannot_be_evaluated_denies() {
        use Access::*;
        let acl = AclFile::parse("topic readwrite #\npattern deny private/%c/#\n").unwrap();
        assert!(allows(&acl, Some("alice"), "c", "public/x", Read));
        assert!(!allows(&acl, Some("alice"), "c", "private/c/x", Read));
        // A client id with a wildcard cannot be substituted safely: denied.
        assert!(!allows(&acl, Some("alice"), "c/#", "public/x", Read));
        // %u for an anonymous client: the pattern is not about it.
        let acl = AclFile::parse("topic readwrite #\npattern deny private/%u/#\n").unwrap();
        assert!(allows(&acl, None, "c", "private/alice/x", Read));
        assert!(!allows(&acl, Some("alice"), "c", "private/alice/x", Read));
    }
}

//! Fuzzes the password and ACL file parsers, and the ACL's decisions on
//! what a client names: the files are an operator's text, the user name,
//! client id and topic a client's. Nothing may panic; a file that parses
//! keeps its count and its digest; a decision does not change when asked
//! again.
//!
//! The input is split at NUL bytes: the password file, the ACL file, then
//! the user name (none when empty), the client id and the topic or filter.

#![no_main]

use libfuzzer_sys::fuzz_target;
use saguin::broker::auth::acl::{allows, Access};
use saguin::config::{AclFile, PasswordFile};

fuzz_target!(|data: &[u8]| {
    let mut pieces = data.split(|&b| b == 0).map(String::from_utf8_lossy);
    let passwords = pieces.next().unwrap_or_default();
    let acl = pieces.next().unwrap_or_default();
    let user = pieces.next().unwrap_or_default();
    let client_id = pieces.next().unwrap_or_default();
    let topic = pieces.next().unwrap_or_default();

    match PasswordFile::parse(&passwords) {
        Ok(file) => {
            assert_eq!(file.sha256().len(), 64);
            assert!(file.len() <= passwords.lines().count());
        }
        Err(problems) => {
            assert!(!problems.is_empty());
            let lines = passwords.lines().count();
            for problem in problems {
                assert!((1..=lines).contains(&problem.line), "{problem:?}");
                assert!(!problem.message.is_empty());
            }
        }
    }

    match AclFile::parse(&acl) {
        Ok(file) => {
            assert!(file.rule_count() <= acl.lines().count());
            let user = (!user.is_empty()).then_some(&*user);
            for access in [Access::Read, Access::Write] {
                let first = allows(&file, user, &client_id, &topic, access);
                assert_eq!(first, allows(&file, user, &client_id, &topic, access));
            }
        }
        Err(problems) => {
            assert!(!problems.is_empty());
            let lines = acl.lines().count();
            for problem in problems {
                assert!((1..=lines).contains(&problem.line), "{problem:?}");
            }
        }
    }
});

//! The broker's authentication and authorisation decisions, on the files
//! `config::auth` parses and validates: [`password`] checks a user's
//! password against the password file (PBKDF2-SHA512 `$7$`, SHA-512 `$6$`)
//! and writes new entries; [`acl`] decides whether the ACL allows a
//! publish, a subscription or a delivery, and is the state's
//! [`Authorizer`](super::state::Authorizer); [`checks`] runs the password
//! checks of CONNECTs on threads of their own.

pub mod acl;
pub mod checks;
pub mod password;
pub mod scram;

pub use acl::{Access, AclAuthorizer};
pub use checks::PasswordChecks;
pub use password::{check_password, hash_password};

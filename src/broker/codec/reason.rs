//! MQTT 5 reason codes (OASIS MQTT 5.0 §2.4) and the MQTT 3.1.1 return codes
//! they map to.

use std::fmt;

use super::primitives::{PacketType, QoS};

/// Every MQTT 5 reason code. Several names share the value 0x00 (Success,
/// Normal disconnection, Granted QoS 0); they are one variant here with
/// aliases as associated constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum ReasonCode {
    #[default]
    Success = 0x00,
    GrantedQoS1 = 0x01,
    GrantedQoS2 = 0x02,
    DisconnectWithWillMessage = 0x04,
    NoMatchingSubscribers = 0x10,
    NoSubscriptionExisted = 0x11,
    ContinueAuthentication = 0x18,
    ReAuthenticate = 0x19,
    UnspecifiedError = 0x80,
    MalformedPacket = 0x81,
    ProtocolError = 0x82,
    ImplementationSpecificError = 0x83,
    UnsupportedProtocolVersion = 0x84,
    ClientIdentifierNotValid = 0x85,
    BadUserNameOrPassword = 0x86,
    NotAuthorized = 0x87,
    ServerUnavailable = 0x88,
    ServerBusy = 0x89,
    Banned = 0x8A,
    ServerShuttingDown = 0x8B,
    BadAuthenticationMethod = 0x8C,
    KeepAliveTimeout = 0x8D,
    SessionTakenOver = 0x8E,
    TopicFilterInvalid = 0x8F,
    TopicNameInvalid = 0x90,
    PacketIdentifierInUse = 0x91,
    PacketIdentifierNotFound = 0x92,
    ReceiveMaximumExceeded = 0x93,
    TopicAliasInvalid = 0x94,
    PacketTooLarge = 0x95,
    MessageRateTooHigh = 0x96,
    QuotaExceeded = 0x97,
    AdministrativeAction = 0x98,
    PayloadFormatInvalid = 0x99,
    RetainNotSupported = 0x9A,
    QoSNotSupported = 0x9B,
    UseAnotherServer = 0x9C,
    ServerMoved = 0x9D,
    SharedSubscriptionsNotSupported = 0x9E,
    ConnectionRateExceeded = 0x9F,
    MaximumConnectTime = 0xA0,
    SubscriptionIdentifiersNotSupported = 0xA1,
    WildcardSubscriptionsNotSupported = 0xA2,
}

/// The MQTT 3.1.1 CONNACK return codes (OASIS MQTT 3.1.1 §3.2.2.3).
pub mod v311_connack {
    pub const ACCEPTED: u8 = 0x00;
    pub const UNACCEPTABLE_PROTOCOL_VERSION: u8 = 0x01;
    pub const IDENTIFIER_REJECTED: u8 = 0x02;
    pub const SERVER_UNAVAILABLE: u8 = 0x03;
    pub const BAD_USER_NAME_OR_PASSWORD: u8 = 0x04;
    pub const NOT_AUTHORIZED: u8 = 0x05;
}

/// The MQTT 3.1.1 SUBACK failure return code.
pub const V311_SUBACK_FAILURE: u8 = 0x80;

impl ReasonCode {
    /// 0x00 in DISCONNECT.
    pub const NORMAL_DISCONNECTION: ReasonCode = ReasonCode::Success;
    /// 0x00 in SUBACK.
    pub const GRANTED_QOS_0: ReasonCode = ReasonCode::Success;

    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// The reason code for a byte, if it is one MQTT 5 defines.
    pub fn from_u8(value: u8) -> Option<ReasonCode> {
        use ReasonCode::*;
        Some(match value {
            0x00 => Success,
            0x01 => GrantedQoS1,
            0x02 => GrantedQoS2,
            0x04 => DisconnectWithWillMessage,
            0x10 => NoMatchingSubscribers,
            0x11 => NoSubscriptionExisted,
            0x18 => ContinueAuthentication,
            0x19 => ReAuthenticate,
            0x80 => UnspecifiedError,
            0x81 => MalformedPacket,
            0x82 => ProtocolError,
            0x83 => ImplementationSpecificError,
            0x84 => UnsupportedProtocolVersion,
            0x85 => ClientIdentifierNotValid,
            0x86 => BadUserNameOrPassword,
            0x87 => NotAuthorized,
            0x88 => ServerUnavailable,
            0x89 => ServerBusy,
            0x8A => Banned,
            0x8B => ServerShuttingDown,
            0x8C => BadAuthenticationMethod,
            0x8D => KeepAliveTimeout,
            0x8E => SessionTakenOver,
            0x8F => TopicFilterInvalid,
            0x90 => TopicNameInvalid,
            0x91 => PacketIdentifierInUse,
            0x92 => PacketIdentifierNotFound,
            0x93 => ReceiveMaximumExceeded,
            0x94 => TopicAliasInvalid,
            0x95 => PacketTooLarge,
            0x96 => MessageRateTooHigh,
            0x97 => QuotaExceeded,
            0x98 => AdministrativeAction,
            0x99 => PayloadFormatInvalid,
            0x9A => RetainNotSupported,
            0x9B => QoSNotSupported,
            0x9C => UseAnotherServer,
            0x9D => ServerMoved,
            0x9E => SharedSubscriptionsNotSupported,
            0x9F => ConnectionRateExceeded,
            0xA0 => MaximumConnectTime,
            0xA1 => SubscriptionIdentifiersNotSupported,
            0xA2 => WildcardSubscriptionsNotSupported,
            _ => return None,
        })
    }

    /// Reason codes of 0x80 and above report failure.
    pub fn is_error(self) -> bool {
        self.as_u8() >= 0x80
    }

    /// The SUBACK code granting `qos`.
    pub fn granted(qos: QoS) -> ReasonCode {
        match qos {
            QoS::AtMostOnce => ReasonCode::Success,
            QoS::AtLeastOnce => ReasonCode::GrantedQoS1,
            QoS::ExactlyOnce => ReasonCode::GrantedQoS2,
        }
    }

    /// Whether MQTT 5 allows this code in a packet of type `packet`
    /// (the tables of §3.2.2.2, §3.4.2.1, §3.5.2.1, §3.6.2.1, §3.7.2.1,
    /// §3.9.3, §3.11.3, §3.14.2.1, §3.15.2.1).
    pub fn allowed_in(self, packet: PacketType) -> bool {
        use ReasonCode::*;
        match packet {
            PacketType::ConnAck => matches!(
                self,
                Success
                    | UnspecifiedError
                    | MalformedPacket
                    | ProtocolError
                    | ImplementationSpecificError
                    | UnsupportedProtocolVersion
                    | ClientIdentifierNotValid
                    | BadUserNameOrPassword
                    | NotAuthorized
                    | ServerUnavailable
                    | ServerBusy
                    | Banned
                    | BadAuthenticationMethod
                    | TopicNameInvalid
                    | PacketTooLarge
                    | QuotaExceeded
                    | PayloadFormatInvalid
                    | RetainNotSupported
                    | QoSNotSupported
                    | UseAnotherServer
                    | ServerMoved
                    | ConnectionRateExceeded
            ),
            PacketType::PubAck | PacketType::PubRec => matches!(
                self,
                Success
                    | NoMatchingSubscribers
                    | UnspecifiedError
                    | ImplementationSpecificError
                    | NotAuthorized
                    | TopicNameInvalid
                    | PacketIdentifierInUse
                    | QuotaExceeded
                    | PayloadFormatInvalid
            ),
            PacketType::PubRel | PacketType::PubComp => {
                matches!(self, Success | PacketIdentifierNotFound)
            }
            PacketType::SubAck => matches!(
                self,
                Success
                    | GrantedQoS1
                    | GrantedQoS2
                    | UnspecifiedError
                    | ImplementationSpecificError
                    | NotAuthorized
                    | TopicFilterInvalid
                    | PacketIdentifierInUse
                    | QuotaExceeded
                    | SharedSubscriptionsNotSupported
                    | SubscriptionIdentifiersNotSupported
                    | WildcardSubscriptionsNotSupported
            ),
            PacketType::UnsubAck => matches!(
                self,
                Success
                    | NoSubscriptionExisted
                    | UnspecifiedError
                    | ImplementationSpecificError
                    | NotAuthorized
                    | TopicFilterInvalid
                    | PacketIdentifierInUse
            ),
            PacketType::Disconnect => matches!(
                self,
                Success
                    | DisconnectWithWillMessage
                    | UnspecifiedError
                    | MalformedPacket
                    | ProtocolError
                    | ImplementationSpecificError
                    | NotAuthorized
                    | ServerBusy
                    | ServerShuttingDown
                    | KeepAliveTimeout
                    | SessionTakenOver
                    | TopicFilterInvalid
                    | TopicNameInvalid
                    | ReceiveMaximumExceeded
                    | TopicAliasInvalid
                    | PacketTooLarge
                    | MessageRateTooHigh
                    | QuotaExceeded
                    | AdministrativeAction
                    | PayloadFormatInvalid
                    | RetainNotSupported
                    | QoSNotSupported
                    | UseAnotherServer
                    | ServerMoved
                    | SharedSubscriptionsNotSupported
                    | ConnectionRateExceeded
                    | MaximumConnectTime
                    | SubscriptionIdentifiersNotSupported
                    | WildcardSubscriptionsNotSupported
            ),
            PacketType::Auth => matches!(self, Success | ContinueAuthentication | ReAuthenticate),
            _ => false,
        }
    }

    /// The MQTT 3.1.1 CONNACK return code closest to this reason: 3.1.1 has
    /// only six, so every refusal without its own code becomes "server
    /// unavailable", "bad user name or password" or "not authorized".
    pub fn to_v311_connack(self) -> u8 {
        use ReasonCode::*;
        match self {
            Success => v311_connack::ACCEPTED,
            UnsupportedProtocolVersion => v311_connack::UNACCEPTABLE_PROTOCOL_VERSION,
            ClientIdentifierNotValid => v311_connack::IDENTIFIER_REJECTED,
            BadUserNameOrPassword | BadAuthenticationMethod => {
                v311_connack::BAD_USER_NAME_OR_PASSWORD
            }
            NotAuthorized | Banned => v311_connack::NOT_AUTHORIZED,
            _ => v311_connack::SERVER_UNAVAILABLE,
        }
    }

    /// The reason code for a 3.1.1 CONNACK return code.
    pub fn from_v311_connack(code: u8) -> Option<ReasonCode> {
        Some(match code {
            v311_connack::ACCEPTED => ReasonCode::Success,
            v311_connack::UNACCEPTABLE_PROTOCOL_VERSION => ReasonCode::UnsupportedProtocolVersion,
            v311_connack::IDENTIFIER_REJECTED => ReasonCode::ClientIdentifierNotValid,
            v311_connack::SERVER_UNAVAILABLE => ReasonCode::ServerUnavailable,
            v311_connack::BAD_USER_NAME_OR_PASSWORD => ReasonCode::BadUserNameOrPassword,
            v311_connack::NOT_AUTHORIZED => ReasonCode::NotAuthorized,
            _ => return None,
        })
    }

    /// The 3.1.1 SUBACK return code: granted QoS, or 0x80 for any failure.
    pub fn to_v311_suback(self) -> u8 {
        match self {
            ReasonCode::Success | ReasonCode::GrantedQoS1 | ReasonCode::GrantedQoS2 => self.as_u8(),
            _ => V311_SUBACK_FAILURE,
        }
    }

    /// The reason code for a 3.1.1 SUBACK return code.
    pub fn from_v311_suback(code: u8) -> Option<ReasonCode> {
        match code {
            0x00 => Some(ReasonCode::Success),
            0x01 => Some(ReasonCode::GrantedQoS1),
            0x02 => Some(ReasonCode::GrantedQoS2),
            V311_SUBACK_FAILURE => Some(ReasonCode::UnspecifiedError),
            _ => None,
        }
    }
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} (0x{:02X})", self, self.as_u8())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips_or_is_undefined() {
        let mut defined = 0;
        for b in 0..=255u8 {
            if let Some(code) = ReasonCode::from_u8(b) {
                assert_eq!(code.as_u8(), b);
                defined += 1;
            }
        }
        // MQTT 5.0 §2.4 defines 43 distinct values.
        assert_eq!(defined, 43);
    }

    #[test]
    fn v311_connack_codes_map_both_ways() {
        for code in 0..=5u8 {
            let reason = ReasonCode::from_v311_connack(code).unwrap();
            assert_eq!(reason.to_v311_connack(), code);
        }
        assert_eq!(ReasonCode::from_v311_connack(6), None);
        assert_eq!(ReasonCode::Banned.to_v311_connack(), 5);
        assert_eq!(ReasonCode::ServerBusy.to_v311_connack(), 3);
        assert_eq!(ReasonCode::QuotaExceeded.to_v311_suback(), 0x80);
        assert_eq!(ReasonCode::GrantedQoS2.to_v311_suback(), 2);
    }

    #[test]
    fn allowed_tables_spot_checks() {
        assert!(ReasonCode::NoMatchingSubscribers.allowed_in(PacketType::PubAck));
        assert!(!ReasonCode::NoMatchingSubscribers.allowed_in(PacketType::PubRel));
        assert!(ReasonCode::PacketIdentifierNotFound.allowed_in(PacketType::PubComp));
        assert!(ReasonCode::ReAuthenticate.allowed_in(PacketType::Auth));
        assert!(!ReasonCode::ReAuthenticate.allowed_in(PacketType::Disconnect));
        assert!(ReasonCode::DisconnectWithWillMessage.allowed_in(PacketType::Disconnect));
        assert!(ReasonCode::GrantedQoS2.allowed_in(PacketType::SubAck));
    }
}

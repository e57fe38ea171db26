//! The `ch-remote` flags of `disk-stream` and `disk-commit`, for their
//! rows of the endpoint table (`crate::endpoints`): each flag and the
//! body field it fills.

use super::endpoint::{Flag, FlagKind};

const DISK: Flag = Flag {
    flag: "disk",
    field: "id",
    kind: FlagKind::Text,
};

const BASE: Flag = Flag {
    flag: "base",
    field: "base",
    kind: FlagKind::OptionalText,
};

const SPEED: Flag = Flag {
    flag: "speed",
    field: "speed",
    kind: FlagKind::OptionalSize,
};

/// `disk-stream --disk ID [--base FILE] [--speed BYTES/S]`.
pub const STREAM_FLAGS: &[Flag] = &[DISK, BASE, SPEED];

/// `disk-commit --disk ID [--top FILE] [--base FILE] [--speed BYTES/S]
/// [--granularity SIZE]`.
pub const COMMIT_FLAGS: &[Flag] = &[
    DISK,
    Flag {
        flag: "top",
        field: "top",
        kind: FlagKind::OptionalText,
    },
    BASE,
    SPEED,
    Flag {
        flag: "granularity",
        field: "granularity",
        kind: FlagKind::OptionalSize,
    },
];

//! The `data` of the events about webhook subscriptions.
use super::{Field, REQ, Variant};

pub(super) const VARIANTS: &[Variant] = &[
    Variant {
        event_type: "webhook.disabled",
        name: "WebhookDisabled",
        description: "berth disabled a webhook subscription: its receiver failed every attempt at one event for \
                      longer than the retry horizon (`BERTH_WEBHOOK_RETRY_HORIZON_SECS`). Nothing more is sent \
                      until it is enabled again (`PATCH /webhooks/{id}`); it resumes at the event it failed.",
        data: &[
            ("webhook_id", Field::Uuid, "The subscription.", REQ),
            (
                "url",
                Field::String,
                "Where it posted, without userinfo, query or fragment (which may carry credentials).",
                REQ,
            ),
            (
                "reason",
                Field::String,
                "The last attempt's failure and how long it failed.",
                REQ,
            ),
            ("event_seq", Field::Integer, "The event it could not deliver.", REQ),
        ],
    },
    Variant {
        event_type: "webhook.lagging",
        name: "WebhookLagging",
        description: "A webhook subscription's oldest undelivered event is older than \
                      `BERTH_WEBHOOK_MAX_LAG_SECS`: it is marked `lagging` and retention no longer keeps events \
                      for it. Delivery goes on; what retention takes before it is delivered is skipped \
                      (`webhook.skipped`).",
        data: &[
            ("webhook_id", Field::Uuid, "The subscription.", REQ),
            (
                "url",
                Field::String,
                "Where it posts, without userinfo, query or fragment.",
                REQ,
            ),
            ("cursor", Field::Integer, "The last event it passed.", REQ),
            (
                "behind_secs",
                Field::Integer,
                "The age of its oldest undelivered event.",
                REQ,
            ),
        ],
    },
    Variant {
        event_type: "webhook.skipped",
        name: "WebhookSkipped",
        description: "A webhook subscription resumed from the oldest event kept: retention took the events \
                      `from_seq` to `to_seq` before it delivered them (it was lagging or disabled).",
        data: &[
            ("webhook_id", Field::Uuid, "The subscription.", REQ),
            (
                "url",
                Field::String,
                "Where it posts, without userinfo, query or fragment.",
                REQ,
            ),
            ("from_seq", Field::Integer, "The first event skipped.", REQ),
            ("to_seq", Field::Integer, "The last event skipped.", REQ),
        ],
    },
];

//! The spec's `Event`: a `oneOf` over the event types, discriminated by `type`, each with its typed `data`.
//! Hand-written (the wire type in `events.rs` carries `data` as JSON): each `data` schema below describes
//! what the `events::append` callers write for that type, field for field. A type added to `EventType`
//! without a schema here fails `tests/api/openapi.rs`.
use std::borrow::Cow;

use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, Discriminator, KnownFormat, ObjectBuilder, OneOfBuilder, Ref, Schema,
    SchemaFormat, SchemaType, Type,
};
use utoipa::{PartialSchema, ToSchema};

use super::events::Event;

/// A field of a `data` object.
#[derive(Clone, Copy)]
enum Field {
    Uuid,
    NullableUuid,
    UuidList,
    String,
    /// One of these strings.
    OneOf(&'static [&'static str]),
    Boolean,
    Integer,
    DateTime,
    /// A component schema by name.
    Named(&'static str),
    /// Any JSON object, as another party (the agent) wrote it.
    AnyObject,
}

/// One event type: its `type`, the name of its schema, what it means, and its `data` fields
/// (name, field, description, required).
struct Variant {
    event_type: &'static str,
    name: &'static str,
    description: &'static str,
    data: &'static [(&'static str, Field, &'static str, bool)],
}

mod webhooks;

/// Every described type: the list below, then those of webhooks (`webhooks.rs`).
fn variants() -> impl Iterator<Item = &'static Variant> {
    VARIANTS.iter().chain(webhooks::VARIANTS)
}

const REQ: bool = true;
const OPT: bool = false;

/// Every event berth appends, in `EventType` order, and `environment.progress` (issue 16's contract).
const VARIANTS: &[Variant] = &[
    Variant {
        event_type: "workspace.created",
        name: "WorkspaceCreated",
        description: "A workspace was created.",
        data: &[("name", Field::String, "The workspace's name.", REQ)],
    },
    Variant {
        event_type: "workspace.columns_changed",
        name: "WorkspaceColumnsChanged",
        description: "A workspace's board columns were added, renamed, reordered or removed.",
        data: &[(
            "column_ids",
            Field::UuidList,
            "The columns now, first to last (`GET /workspaces/{id}/columns` shows them).",
            REQ,
        )],
    },
    Variant {
        event_type: "workspace.deleted",
        name: "WorkspaceDeleted",
        description: "A workspace was deleted with its tasks and repositories; cleanup jobs remove the files.",
        data: &[("tasks", Field::Integer, "How many tasks were deleted with it.", REQ)],
    },
    Variant {
        event_type: "repository.created",
        name: "RepositoryCreated",
        description: "A repository was registered in the workspace.",
        data: &[
            ("repository_id", Field::Uuid, "", REQ),
            ("name", Field::String, "The repository's name.", REQ),
        ],
    },
    Variant {
        event_type: "repository.deleted",
        name: "RepositoryDeleted",
        description: "A repository was deregistered (nothing on disk changed).",
        data: &[("repository_id", Field::Uuid, "", REQ)],
    },
    Variant {
        event_type: "task.created",
        name: "TaskCreated",
        description: "A task was created.",
        data: &[
            ("title", Field::String, "", REQ),
            ("kind", Field::Named("TaskKind"), "", REQ),
            ("parent_task_id", Field::NullableUuid, "The parent, for a subtask.", REQ),
        ],
    },
    Variant {
        event_type: "task.updated",
        name: "TaskUpdated",
        description: "A task's fields changed: by an update, or when it took over the environment of a deleted \
                      parent it inherited (then `environment_transferred_from` names that parent).",
        data: &[
            (
                "changed",
                Field::AnyObject,
                "The fields that changed, with their new values: `title`, `description`, `workspace_mode`, or \
                 `column_id` (then `reason` says why: `requested`, or `session_started` when a started session \
                 moved it).",
                REQ,
            ),
            (
                "environment_transferred_from",
                Field::Uuid,
                "The deleted task whose environment this task now owns.",
                OPT,
            ),
        ],
    },
    Variant {
        event_type: "task.archived",
        name: "TaskArchived",
        description: "A task was archived; a cleanup job removes its clean worktrees.",
        data: &[(
            "cascade",
            Field::Boolean,
            "Whether it was archived as part of a cascade request.",
            REQ,
        )],
    },
    Variant {
        event_type: "task.unarchived",
        name: "TaskUnarchived",
        description: "A task was unarchived.",
        data: &[(
            "cancelled_cleanup_jobs",
            Field::UuidList,
            "The archive cleanup jobs that had not started and were cancelled.",
            REQ,
        )],
    },
    Variant {
        event_type: "task.deleted",
        name: "TaskDeleted",
        description: "A task was deleted; a cleanup job removes its worktrees, branches and environment.",
        data: &[("trigger", Field::Named("CleanupJobTrigger"), "What deleted it.", REQ)],
    },
    Variant {
        event_type: "environment.created",
        name: "EnvironmentCreated",
        description: "A task's environment started materializing.",
        data: &[
            ("executor_type", Field::Named("ExecutorType"), "", REQ),
            ("status", Field::OneOf(&["creating"]), "", REQ),
        ],
    },
    Variant {
        event_type: "environment.ready",
        name: "EnvironmentReady",
        description: "A task's environment is ready for sessions: materialized (with `executor_type`), or moved \
                      to another executor (with `reason`).",
        data: &[
            (
                "executor_type",
                Field::Named("ExecutorType"),
                "When it was materialized.",
                OPT,
            ),
            (
                "reason",
                Field::OneOf(&["executor_transition", "recovered"]),
                "`executor_transition`: it changed executor; `recovered`: a broken environment admission \
                 proved again.",
                OPT,
            ),
        ],
    },
    Variant {
        event_type: "environment.failed",
        name: "EnvironmentFailed",
        description: "Materializing a task's environment failed; the session that asked for it failed too.",
        data: &[(
            "repository_id",
            Field::NullableUuid,
            "The repository whose worktree could not be made, when one could not.",
            REQ,
        )],
    },
    Variant {
        event_type: "environment.superseded",
        name: "EnvironmentSuperseded",
        description: "An environment is no longer its task's current one.",
        data: &[(
            "reason",
            Field::OneOf(&["retry", "cleanup", "executor_transition"]),
            "`retry`: a failed one replaced by a new attempt; `cleanup`: removed by a cleanup job; \
             `executor_transition`: replaced for another executor.",
            REQ,
        )],
    },
    Variant {
        event_type: "environment.reset",
        name: "EnvironmentReset",
        description: "A task's environment was reset; the cleanup job removes it, and the next session \
                      materializes a fresh one.",
        data: &[("cleanup_job_id", Field::Uuid, "", REQ)],
    },
    Variant {
        event_type: "environment.broken",
        name: "EnvironmentBroken",
        description: "Admission found a task's current environment unsafe to work in (or unsafe for another \
                      reason than before): no agent starts in it and its git status reads stale. Every launch \
                      proves it again (mended, it is ready again); otherwise resetting it is the way back.",
        data: &[
            ("category", Field::Named("ReuseCategory"), "What admission found.", REQ),
            (
                "recovery",
                Field::OneOf(&["reset_environment"]),
                "What brings it back: `POST /tasks/{id}/environment/reset`.",
                REQ,
            ),
        ],
    },
    Variant {
        event_type: "environment.lost",
        name: "EnvironmentLost",
        description: "The node whose disk held a task's environment was decommissioned: the environment is \
                      `lost`, no longer the task's current one; the next session of the task gets a new one.",
        data: &[("node_id", Field::String, "The decommissioned node.", REQ)],
    },
    Variant {
        event_type: "environment.restored",
        name: "EnvironmentRestored",
        description: "A task's environment's worktrees were put back to a checkpoint (`POST \
                      /environments/{id}/restore`); the state after it is a new checkpoint.",
        data: &[
            ("checkpoint_id", Field::Uuid, "The checkpoint restored.", REQ),
            (
                "new_checkpoint_id",
                Field::Uuid,
                "The checkpoint of the state after the restore.",
                REQ,
            ),
            (
                "discarded_changes",
                Field::Boolean,
                "Changes since the last checkpoint were discarded (with consent).",
                REQ,
            ),
        ],
    },
    Variant {
        event_type: "review.created",
        name: "ReviewCreated",
        description: "A review of a task's environment's diff was stored (`POST /environments/{id}/reviews`); \
                      sent to a session, its message is in that session's inbox (`session.message_updated`).",
        data: &[
            ("review_id", Field::Uuid, "The review.", REQ),
            ("comments", Field::Integer, "How many line comments it has.", REQ),
            (
                "message_id",
                Field::NullableUuid,
                "The inbox message that carries it to the session, when one was named.",
                REQ,
            ),
        ],
    },
    Variant {
        event_type: "environment.committed",
        name: "EnvironmentCommitted",
        description: "What was in a task's worktrees was committed on their task branches (`POST \
                      /environments/{id}/commits`).",
        data: &[(
            "commits",
            Field::AnyObject,
            "One entry per repository that had something to commit: `{repository_id, branch, commit}`.",
            REQ,
        )],
    },
    Variant {
        event_type: "environment.merged",
        name: "EnvironmentMerged",
        description: "A task branch was merged into a branch of its repository (`POST /environments/{id}/merge`).",
        data: &[
            ("repository_id", Field::Uuid, "The repository.", REQ),
            ("into", Field::String, "The branch that moved.", REQ),
            (
                "strategy",
                Field::OneOf(&["merge", "squash", "fast_forward"]),
                "How.",
                REQ,
            ),
            ("previous_commit", Field::String, "Where it pointed before.", REQ),
            ("commit", Field::String, "Where it points now.", REQ),
        ],
    },
    Variant {
        event_type: "environment.pushed",
        name: "EnvironmentPushed",
        description: "A task branch was pushed to a remote (`POST /environments/{id}/push`, or a pull request).",
        data: &[
            ("repository_id", Field::Uuid, "The repository.", REQ),
            ("remote", Field::String, "The remote's name.", REQ),
            ("branch", Field::String, "The branch, pushed under its own name.", REQ),
            ("commit", Field::String, "The commit the remote branch points at.", REQ),
        ],
    },
    Variant {
        event_type: "pull_request.updated",
        name: "PullRequestUpdated",
        description: "A pull request of a task was opened, or its state changed on its host.",
        data: &[(
            "pull_request",
            Field::Named("PullRequest"),
            "The pull request as the task lists it.",
            REQ,
        )],
    },
    Variant {
        event_type: "environment.progress",
        name: "EnvironmentProgress",
        description: "Materializing a task's environment moved on, per repository (an asynchronous session \
                      create).",
        data: &[
            ("repository_id", Field::Uuid, "", REQ),
            (
                "stage",
                Field::OneOf(&["fetching", "creating_worktree", "ready"]),
                "",
                REQ,
            ),
        ],
    },
    Variant {
        event_type: "session.created",
        name: "SessionCreated",
        description: "A session was created on a task.",
        data: &[
            (
                "is_primary",
                Field::Boolean,
                "Whether it became the task's primary.",
                REQ,
            ),
            ("executor_type", Field::Named("ExecutorType"), "", REQ),
        ],
    },
    Variant {
        event_type: "session.state_changed",
        name: "SessionStateChanged",
        description: "A session moved to another state.",
        data: &[("state", Field::Named("SessionState"), "The new state.", REQ)],
    },
    Variant {
        event_type: "session.deleted",
        name: "SessionDeleted",
        description: "A session and its conversation were deleted (its task's files remain).",
        data: &[("was_primary", Field::Boolean, "", REQ)],
    },
    Variant {
        event_type: "session.primary_changed",
        name: "SessionPrimaryChanged",
        description: "This event's session became its task's primary.",
        data: &[
            (
                "previous_session_id",
                Field::NullableUuid,
                "The session that was primary before.",
                REQ,
            ),
            (
                "reason",
                Field::OneOf(&["requested", "primary_deleted"]),
                "`requested`: made primary by a client; `primary_deleted`: promoted when the primary was deleted.",
                REQ,
            ),
        ],
    },
    Variant {
        event_type: "session.message_updated",
        name: "SessionMessageUpdated",
        description: "A message for the session's agent was stored or changed state.",
        data: &[("message", Field::Named("Message"), "The message as it is now.", REQ)],
    },
    Variant {
        event_type: "session.egress_refused",
        name: "SessionEgressRefused",
        description: "The session's agent asked its box for an address its profile does not list (README \"What an agent can reach\"): refused. Each name is reported once per agent process.",
        data: &[
            ("address", Field::String, "The name the agent asked for.", REQ),
            ("execution_id", Field::Uuid, "The agent process that asked.", REQ),
        ],
    },
    Variant {
        event_type: "runtime.output",
        name: "RuntimeOutput",
        description: "The agent reported something: its own event, as it sent it.",
        data: &[(
            "event",
            Field::AnyObject,
            "The agent's event (Pi: one RPC event such as `message_update` or `message_end`), as it sent it.",
            REQ,
        )],
    },
    Variant {
        event_type: "git_status.updated",
        name: "GitStatusUpdated",
        description: "A repository of an environment has a newer git status; read it from the environment's \
                      git status.",
        data: &[
            ("repository_id", Field::Uuid, "", REQ),
            ("kind", Field::Named("ObservationKind"), "", REQ),
            ("observed_at", Field::DateTime, "", REQ),
        ],
    },
    Variant {
        event_type: "cleanup_job.updated",
        name: "CleanupJobUpdated",
        description: "A cleanup job was created or changed state.",
        data: &[
            ("cleanup_job_id", Field::Uuid, "", REQ),
            ("state", Field::Named("CleanupJobState"), "", REQ),
            ("trigger", Field::Named("CleanupJobTrigger"), "", REQ),
        ],
    },
];

/// The event types the union describes (for the test that every `EventType` has one).
pub fn described_types() -> Vec<&'static str> {
    variants().map(|v| v.event_type).collect()
}

fn event_name(v: &Variant) -> String {
    format!("{}Event", v.name)
}

fn data_name(v: &Variant) -> String {
    format!("{}Data", v.name)
}

fn string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String)
}

fn uuid() -> ObjectBuilder {
    string().format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)))
}

fn nullable_uuid() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)))
}

fn field_schema(field: Field, description: &str) -> RefOr<Schema> {
    let described = |b: ObjectBuilder| -> RefOr<Schema> {
        let b = if description.is_empty() {
            b
        } else {
            b.description(Some(description))
        };
        RefOr::T(Schema::Object(b.build()))
    };
    match field {
        Field::Uuid => described(uuid()),
        Field::NullableUuid => described(nullable_uuid()),
        Field::UuidList => {
            let items = ArrayBuilder::new().items(RefOr::T(Schema::Object(uuid().build())));
            let items = if description.is_empty() {
                items
            } else {
                items.description(Some(description))
            };
            RefOr::T(Schema::Array(items.build()))
        }
        Field::String => described(string()),
        Field::OneOf(values) => described(string().enum_values(Some(values.iter().copied()))),
        Field::Boolean => described(ObjectBuilder::new().schema_type(Type::Boolean)),
        Field::Integer => described(ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0))),
        Field::DateTime => described(string().format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))),
        Field::AnyObject => described(
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .additional_properties(Some(AdditionalProperties::FreeForm(true))),
        ),
        Field::Named(name) => RefOr::Ref(Ref::from_schema_name(name)),
    }
}

fn data_schema(v: &Variant) -> Schema {
    let mut b = ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(format!("`data` of a `{}` event.", v.event_type)));
    for (name, field, description, required) in v.data {
        b = b.property(*name, field_schema(*field, description));
        if *required {
            b = b.required(*name);
        }
    }
    Schema::Object(b.build())
}

/// The envelope every event shares, with this type's `type` and `data`.
fn event_schema(v: &Variant) -> Schema {
    let env_uuid = |d: &str| RefOr::T(Schema::Object(nullable_uuid().description(Some(d)).build()));
    let b = ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(v.description))
        .property("version", string().description(Some("Always `v1`.")))
        .property(
            "instance_id",
            uuid().description(Some("The server generation that wrote the event.")),
        )
        .property(
            "seq",
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
                .description(Some("Strictly increasing across all events; the SSE `id`.")),
        )
        .property("type", string().enum_values(Some([v.event_type])))
        .property("workspace_id", env_uuid("The workspace the event belongs to."))
        .property(
            "task_id",
            env_uuid("The task, for task, environment, session and cleanup events."),
        )
        .property("session_id", env_uuid("The session, for session and runtime events."))
        .property(
            "task_environment_id",
            env_uuid("The environment, for environment and git status events."),
        )
        .property("execution_id", env_uuid("The agent process run, for runtime events."))
        .property("data", Ref::from_schema_name(data_name(v)))
        .property(
            "created_at",
            string().format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime))),
        )
        .property(
            "actor",
            OneOfBuilder::new()
                .item(Ref::from_schema_name("Actor"))
                .item(ObjectBuilder::new().schema_type(Type::Null))
                .description(Some(
                    "Who did it: the token's `sub` (and session, for an agent's token); `null` when berth did it on its own.",
                )),
        );
    let b = ["version", "instance_id", "seq", "type", "data", "created_at"]
        .into_iter()
        .fold(b, |b, name| b.required(name));
    Schema::Object(b.build())
}

impl PartialSchema for Event {
    fn schema() -> RefOr<Schema> {
        let mut discriminator = Discriminator::new("type");
        let mut union = OneOfBuilder::new().description(Some(
            "One event of the global sequence. `type` says which, and what `data` holds; the envelope \
             fields are the same for all. A client should skip a `type` it does not know: new types are \
             added without a new API version.",
        ));
        for v in variants() {
            let name = event_name(v);
            discriminator
                .mapping
                .insert(v.event_type.to_string(), format!("#/components/schemas/{name}"));
            union = union.item(Ref::from_schema_name(name));
        }
        RefOr::T(Schema::OneOf(union.discriminator(Some(discriminator)).build()))
    }
}

impl ToSchema for Event {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Event")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        for v in variants() {
            schemas.push((event_name(v), RefOr::T(event_schema(v))));
            schemas.push((data_name(v), RefOr::T(data_schema(v))));
        }
    }
}

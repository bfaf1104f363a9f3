//! The authenticated caller, with the scope a route needs declared in its signature:
//! `auth: Authorized<TasksRead>` both verifies the bearer token and requires `tasks:read`;
//! `auth: Unbound<TasksWrite>` also refuses a session-bound token (an agent's), handing the domain an
//! `UnboundPrincipal` so it need not check again.
use std::future::{Ready, ready};

use futures_util::future::LocalBoxFuture;
use std::marker::PhantomData;

use actix_web::http::header::AUTHORIZATION;
use actix_web::{FromRequest, HttpRequest, dev::Payload, web};

use super::AppState;
use crate::auth::{Principal, Scope, UnboundPrincipal};
use crate::domain::precondition::IfMatch;
use crate::error::Error;

pub trait RequiredScope {
    const SCOPE: Scope;
}

macro_rules! scope_markers {
    ($($name:ident => $scope:expr),* $(,)?) => {
        $(
            #[doc = concat!("Requires the `", stringify!($name), "` scope.")]
            pub struct $name;
            impl RequiredScope for $name {
                const SCOPE: Scope = $scope;
            }
        )*
    };
}

scope_markers! {
    WorkspacesAdmin => Scope::WorkspacesAdmin,
    TasksRead => Scope::TasksRead,
    TasksWrite => Scope::TasksWrite,
    TasksLand => Scope::TasksLand,
    SessionsRead => Scope::SessionsRead,
    SessionsWrite => Scope::SessionsWrite,
    SessionsDelete => Scope::SessionsDelete,
    EventsRead => Scope::EventsRead,
    TasksArchive => Scope::TasksArchive,
    TasksDelete => Scope::TasksDelete,
    CleanupRead => Scope::CleanupRead,
    CleanupAdmin => Scope::CleanupAdmin,
    WebhooksWrite => Scope::WebhooksWrite,
    Admin => Scope::Admin,
}

/// The request's `If-Match` (absent when not sent); a malformed one is a 400.
pub struct IfMatchHeader(pub IfMatch);

impl FromRequest for IfMatchHeader {
    type Error = Error;
    type Future = Ready<Result<Self, Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let value = req.headers().get(actix_web::http::header::IF_MATCH).map(|v| v.to_str());
        ready(match value {
            Some(Err(_)) => Err(Error::BadRequest("If-Match must be visible ASCII".into())),
            Some(Ok(v)) => IfMatch::parse(Some(v))
                .map(IfMatchHeader)
                .ok_or_else(|| Error::BadRequest("If-Match must be `*` or a list of quoted entity tags".into())),
            None => Ok(IfMatchHeader(IfMatch::Absent)),
        })
    }
}

pub struct Authorized<S>(pub Principal, PhantomData<S>);

impl<S> std::ops::Deref for Authorized<S> {
    type Target = Principal;
    fn deref(&self) -> &Principal {
        &self.0
    }
}

impl<S: RequiredScope> FromRequest for Authorized<S> {
    type Error = Error;
    type Future = LocalBoxFuture<'static, Result<Self, Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            let p = authenticate(&req).await?;
            p.require(S::SCOPE)?;
            Ok(Authorized(p, PhantomData))
        })
    }
}

/// A caller with the scope `S` whose token is not bound to a session.
pub struct Unbound<S>(pub UnboundPrincipal, PhantomData<S>);

impl<S> std::ops::Deref for Unbound<S> {
    type Target = UnboundPrincipal;
    fn deref(&self) -> &UnboundPrincipal {
        &self.0
    }
}

impl<S: RequiredScope> FromRequest for Unbound<S> {
    type Error = Error;
    type Future = LocalBoxFuture<'static, Result<Self, Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            let p = authenticate(&req).await?;
            p.require(S::SCOPE)?;
            Ok(Unbound(p.unbound()?, PhantomData))
        })
    }
}

/// The verified principal of the request's bearer token (a JWKS may be read again for a new `kid`).
pub(crate) async fn authenticate(req: &HttpRequest) -> Result<Principal, Error> {
    let state = req
        .app_data::<web::Data<AppState>>()
        .ok_or_else(|| Error::Internal(anyhow::anyhow!("no app state")))?;
    let header = req
        .headers()
        .get(AUTHORIZATION)
        .ok_or(Error::Unauthenticated("an Authorization: Bearer token is required"))?;
    let value = header
        .to_str()
        .map_err(|_| Error::Unauthenticated("malformed Authorization header"))?;
    let (scheme, token) = value
        .split_once(' ')
        .ok_or(Error::Unauthenticated("malformed Authorization header"))?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(Error::Unauthenticated("the Authorization scheme must be Bearer"));
    }
    let verifier = state.verifier.clone();
    let principal = verifier.authenticate(token.trim()).await?;
    record_actor(req, &principal);
    Ok(principal)
}

/// Issue 17 item 7: the proven caller becomes the request's actor (events and jobs record it) and a
/// field of its log lines.
pub(crate) fn record_actor(req: &HttpRequest, p: &Principal) {
    use actix_web::HttpMessage;
    crate::actor::record(crate::actor::Actor {
        sub: p.sub.clone(),
        session_id: p.session_id,
    });
    if let Some(span) = req.extensions().get::<tracing_actix_web::RootSpan>() {
        span.record("actor", p.sub.as_str());
        if let Some(s) = p.session_id {
            span.record("actor_session_id", tracing::field::display(s));
        }
    }
}

/// The follow point of this request (issue 16, item 3): a seq such that every event with a seq at most
/// this is committed, read before the handler's queries (the `follow_point` middleware), so whatever
/// the handler reads reflects it. Lists return it as `latest_seq`; every GET carries it as `X-Berth-Seq`.
#[derive(Debug, Clone, Copy)]
pub struct FollowPoint(pub i64);

impl FromRequest for FollowPoint {
    type Error = Error;
    type Future = Ready<Result<Self, Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        use actix_web::HttpMessage;
        let point = req.extensions().get::<FollowPoint>().copied();
        ready(point.ok_or_else(|| Error::Internal(anyhow::anyhow!("the follow_point middleware did not run"))))
    }
}

/// For a body field that may be set to `null`: present (even as `null`) is `Some`, absent is `None`
/// (`#[serde(default, deserialize_with = "super::extract::present")]` on an `Option<Option<T>>`).
pub fn present<'de, D: serde::Deserializer<'de>, T: serde::Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    use serde::Deserialize as _;
    Option::<T>::deserialize(d).map(Some)
}

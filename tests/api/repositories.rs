//! Repository registration proves, read-only, that a path is an allowed git work tree; every refusal
//! creates nothing and names no path (I34). Deregistration is refused while a live task uses it.
use std::os::unix::fs::symlink;

use serde_json::json;

use crate::both_backends;
use crate::helpers::{TestApp, assert_no_path, git, git_repo, id_of};

both_backends!(
    register_records_identity_and_default_branch,
    registration_refusals_create_nothing,
    repo_roots_refuse_outside_paths_and_symlinks_out,
    delete_is_refused_while_a_task_uses_it,
    duplicate_registration_is_a_conflict,
);

async fn register_records_identity_and_default_branch(app: TestApp) {
    let ws = app.workspace("ws").await;
    let path = git_repo(&app.scratch.path().join("svc"), "trunk");
    let r = app
        .post(&format!("/api/v1/workspaces/{ws}/repositories"), json!({"path": path}))
        .await;
    let repo = r.ok(201);
    let id = id_of(&repo);
    assert_eq!(r.header("location").unwrap(), format!("/api/v1/repositories/{id}"));
    assert_eq!(repo["name"], "svc");
    assert_eq!(repo["path"], path.display().to_string());
    assert_eq!(repo["common_git_dir"], path.join(".git").display().to_string());
    assert_eq!(repo["default_branch"], "trunk", "taken from HEAD");
    assert_eq!(app.get(&format!("/api/v1/repositories/{id}")).await.ok(200), repo);
    let list = app.get(&format!("/api/v1/workspaces/{ws}/repositories")).await.ok(200);
    assert_eq!(list["items"][0], repo);

    // A linked worktree of it registers with the same identity (its common git dir).
    let linked = app.scratch.path().canonicalize().unwrap().join("svc-linked");
    git(
        &path,
        &["worktree", "add", "-q", "-b", "side", linked.to_str().unwrap()],
    );
    let other = app
        .post(
            &format!("/api/v1/workspaces/{ws}/repositories"),
            json!({"path": linked, "name": "svc-side", "default_branch": "trunk"}),
        )
        .await
        .ok(201);
    assert_eq!(other["common_git_dir"], repo["common_git_dir"]);
    assert_eq!(other["default_branch"], "trunk");
    // Registration is read-only: HEAD, index and files of the source are untouched.
    assert_eq!(git(&path, &["status", "--porcelain"]), "");
    assert_eq!(git(&path, &["rev-parse", "--abbrev-ref", "HEAD"]).trim(), "trunk");
}

async fn registration_refusals_create_nothing(app: TestApp) {
    let ws = app.workspace("ws").await;
    let url = format!("/api/v1/workspaces/{ws}/repositories");
    let scratch = app.scratch.path().canonicalize().unwrap();
    let repo = git_repo(&scratch.join("real"), "main");
    let plain = scratch.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let bare = scratch.join("bare.git");
    git(&scratch, &["init", "-q", "--bare", bare.to_str().unwrap()]);
    std::fs::create_dir_all(repo.join("sub")).unwrap();
    let link = scratch.join("link-to-real");
    symlink(&repo, &link).unwrap();
    let worktree_root = app.config.worktree_root.join("inside");
    git_repo(&worktree_root, "main");

    let cases: Vec<(&str, serde_json::Value, u16, &str)> = vec![
        ("relative", json!({"path": "real"}), 422, "path_not_allowed"),
        (
            "dot-dot",
            json!({"path": format!("{}/../real", scratch.join("plain").display())}),
            422,
            "path_not_allowed",
        ),
        ("symlink", json!({"path": link}), 422, "path_not_allowed"),
        (
            "non-existent",
            json!({"path": scratch.join("nope")}),
            422,
            "not_a_git_repository",
        ),
        ("not a repository", json!({"path": plain}), 422, "not_a_git_repository"),
        ("bare", json!({"path": bare}), 422, "not_a_git_repository"),
        (
            "subdirectory",
            json!({"path": repo.join("sub")}),
            422,
            "not_a_git_repository",
        ),
        (
            "inside the worktree root",
            json!({"path": worktree_root}),
            422,
            "path_not_allowed",
        ),
        ("empty", json!({"path": ""}), 422, "validation_failed"),
        (
            "bad name",
            json!({"path": repo, "name": "../escape"}),
            422,
            "validation_failed",
        ),
        (
            "bad default branch",
            json!({"path": repo, "default_branch": "a..b"}),
            422,
            "validation_failed",
        ),
    ];
    for (case, body, status, code) in cases {
        let r = app.post(&url, body).await;
        assert_eq!(r.status.as_u16(), status, "{case}: {}", r.text);
        r.problem(status, code);
        assert_no_path(&r, &scratch);
        assert_no_path(&r, &app.config.worktree_root);
    }
    assert_eq!(app.count("repositories").await, 0);
    assert_eq!(app.count("events").await, 1, "only the workspace's event");
}

async fn repo_roots_refuse_outside_paths_and_symlinks_out(app: TestApp) {
    // A second app on the same backend, limited to one allowed root.
    let dirs = tempfile::TempDir::new().unwrap();
    let base = dirs.path().canonicalize().unwrap();
    let allowed = base.join("allowed");
    std::fs::create_dir_all(&allowed).unwrap();
    let inside = git_repo(&allowed.join("inside"), "main");
    let outside = git_repo(&base.join("outside"), "main");
    let link_out = allowed.join("sneaky");
    symlink(&outside, &link_out).unwrap();
    let Some(app) = app
        .respawn_with(&[("BERTH_REPO_ROOTS", allowed.to_str().unwrap())])
        .await
    else {
        return;
    };
    let ws = app.workspace("ws").await;
    let url = format!("/api/v1/workspaces/{ws}/repositories");
    for (case, path) in [
        ("outside", outside.clone()),
        ("symlink pointing outside", link_out.clone()),
    ] {
        let r = app.post(&url, json!({"path": path})).await;
        r.problem(422, "path_not_allowed");
        assert_no_path(&r, &base);
        assert!(!r.text.contains("outside/"), "{case}");
    }
    // A path outside the roots is refused before it is probed: a missing one is not reported missing.
    app.post(&url, json!({"path": base.join("missing")}))
        .await
        .problem(422, "path_not_allowed");
    assert_eq!(app.count("repositories").await, 0);
    app.post(&url, json!({"path": inside})).await.ok(201);
}

async fn delete_is_refused_while_a_task_uses_it(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, path) = app.repository(ws, "used").await;
    let (unused, _) = app.repository(ws, "unused").await;
    let task = app
        .post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": "t", "repositories": [{"repository_id": repo}]}),
        )
        .await
        .ok(201);
    let r = app.delete(&format!("/api/v1/repositories/{repo}")).await;
    assert_eq!(r.problem(409, "repository_in_use")["task_count"], 1);
    app.get(&format!("/api/v1/repositories/{repo}")).await.ok(200);
    assert_eq!(
        app.get(&format!("/api/v1/tasks/{}", id_of(&task))).await.ok(200)["repositories"][0]["repository_id"],
        repo.to_string()
    );

    // An unused one goes: 204, then 404, gone from the list; the directory is untouched.
    app.delete(&format!("/api/v1/repositories/{unused}")).await.ok(204);
    app.get(&format!("/api/v1/repositories/{unused}"))
        .await
        .problem(404, "not_found");
    app.delete(&format!("/api/v1/repositories/{unused}"))
        .await
        .problem(404, "not_found");
    let list = app.get(&format!("/api/v1/workspaces/{ws}/repositories")).await.ok(200);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert!(path.join(".git").is_dir());
    assert!(
        app.scratch.path().join("unused/.git").is_dir(),
        "deregistering never touches the disk"
    );
    // It can be registered again.
    let again = app
        .post(
            &format!("/api/v1/workspaces/{ws}/repositories"),
            json!({"path": app.scratch.path().canonicalize().unwrap().join("unused")}),
        )
        .await;
    again.ok(201);
    let types: Vec<String> = app.events().await.into_iter().map(|e| e.1).collect();
    assert!(types.contains(&"repository.deleted".to_string()));
}

async fn duplicate_registration_is_a_conflict(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (_, path) = app.repository(ws, "dup").await;
    app.post(&format!("/api/v1/workspaces/{ws}/repositories"), json!({"path": path}))
        .await
        .problem(409, "conflict");
    // Same name, other path: the name names worktree directories, so it is unique too.
    let other = git_repo(&app.scratch.path().join("elsewhere/dup"), "main");
    app.post(&format!("/api/v1/workspaces/{ws}/repositories"), json!({"path": other}))
        .await
        .problem(409, "conflict");
    // Another workspace may register the same path.
    let ws2 = app.workspace("ws2").await;
    app.post(&format!("/api/v1/workspaces/{ws2}/repositories"), json!({"path": path}))
        .await
        .ok(201);
    assert_eq!(app.count("repositories").await, 2);
}

//! `tessera key create|ls|revoke`: scoped S3 access keys (crate `access`), stored in the
//! cluster, so every gateway honours them; managed with the cluster's config (its secret).

use access::{AccessKey, Buckets, KeyStore, Permission};

use crate::ConfigArg;

#[derive(Debug, clap::Args)]
pub(crate) struct KeyArgs {
    #[command(subcommand)]
    action: KeyAction,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Debug, clap::Subcommand)]
enum KeyAction {
    /// Make a key limited to some buckets (or all), read-write unless --read-only; prints its
    /// access key and secret key (the secret is shown only here).
    Create {
        /// A bucket the key reaches (repeat for more).
        #[arg(long = "bucket", value_name = "BUCKET", required_unless_present = "all_buckets")]
        buckets: Vec<String>,
        /// Every bucket, present and future, instead of --bucket.
        #[arg(long, conflicts_with = "buckets")]
        all_buckets: bool,
        /// Read and list only: no PUT, copy or delete.
        #[arg(long)]
        read_only: bool,
        /// Free text shown by `tessera key ls`.
        #[arg(long, default_value = "")]
        description: String,
        /// One JSON object with the key and its secret.
        #[arg(long)]
        json: bool,
    },
    /// List the keys (never their secrets).
    Ls {
        /// One JSON object per key, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key: gateways refuse it within s3::KEY_CACHE_TTL (5 s).
    Revoke {
        /// The access key id (TK...).
        access_key: String,
    },
}

pub(crate) fn run(args: &KeyArgs) -> anyhow::Result<()> {
    crate::init_logging("warn");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = crate::object_cmd::connect(&args.config)?;
        let store = KeyStore::new(client);
        match &args.action {
            KeyAction::Create { buckets, all_buckets, read_only, description, json } => {
                let scope = if *all_buckets { Buckets::All } else { Buckets::Only(buckets.clone()) };
                let permission = if *read_only { Permission::ReadOnly } else { Permission::ReadWrite };
                let (key, secret) = store.create(scope, permission, description).await?;
                if *json {
                    let mut value = key_json(&key);
                    value["secret_key"] = secret.expose().into();
                    println!("{value}");
                } else {
                    println!("access key: {}", key.id);
                    println!("secret key: {}", secret.expose());
                    println!("{} on buckets {} (the secret is not shown again)", key.permission, key.buckets);
                }
            }
            KeyAction::Ls { json } => {
                let keys = store.list().await?;
                if *json {
                    for (id, key) in &keys {
                        match key {
                            Ok(key) => println!("{}", key_json(key)),
                            Err(e) => println!("{}", serde_json::json!({ "access_key": id, "error": e.to_string() })),
                        }
                    }
                } else if keys.is_empty() {
                    println!("no access keys besides the root credentials (create one with `tessera key create`)");
                } else {
                    println!(
                        "{:<22} {:<10} {:<24} {:<30} DESCRIPTION",
                        "ACCESS KEY", "PERMISSION", "CREATED", "BUCKETS"
                    );
                    for (id, key) in &keys {
                        match key {
                            Ok(key) => println!(
                                "{:<22} {:<10} {:<24} {:<30} {}",
                                key.id,
                                key.permission,
                                crate::object_cmd::format_ms(key.created_ms),
                                key.buckets,
                                key.description
                            ),
                            // Gateways refuse it; say so rather than show a scope nobody sealed.
                            Err(e) => println!("{id:<22} REFUSED    {e}"),
                        }
                    }
                }
            }
            KeyAction::Revoke { access_key } => {
                store.revoke(access_key).await?;
                println!("revoked {access_key}: gateways refuse it within {} s", s3::KEY_CACHE_TTL.as_secs());
            }
        }
        Ok(())
    })
}

fn key_json(key: &AccessKey) -> serde_json::Value {
    let buckets = match &key.buckets {
        Buckets::All => serde_json::Value::from("*"),
        Buckets::Only(names) => serde_json::Value::from(names.clone()),
    };
    serde_json::json!({
        "access_key": key.id,
        "permission": key.permission.to_string(),
        "buckets": buckets,
        "created_ms": key.created_ms,
        "description": key.description,
    })
}

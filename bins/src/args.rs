//! The command line as clap parses it: every verb, its arguments, and its help with examples.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Share MCP servers between machines, peer to peer.
#[derive(Debug, Parser)]
#[command(
    name = "mcpmesh",
    version,
    about = "Share MCP servers between machines, peer to peer.",
    long_about = "Share MCP servers between machines, peer to peer.\n\nEach machine runs one node (started by itself when a verb needs it). A node serves local MCP servers to the peers it trusts, and mounts its peers' servers into your AI clients.",
    after_help = "Get started:\n  mcpmesh demo                                 see two nodes share a tool, on this machine\n  mcpmesh serve notes -- npx -y @modelcontextprotocol/server-filesystem ~/notes\n  mcpmesh invite notes                         a one-line invite for whoever should use it\n  mcpmesh pair 'mcpmesh-invite:…'              on their machine\n  mcpmesh use alice/notes                      how to add it to Claude, Cursor, VS Code",
    propagate_version = true
)]
pub struct Cli {
    /// Keep all of this node's state under DIR (same as MCPMESH_HOME). DIR must be a profile
    /// made before (`mcpmesh --home DIR init`); only `init`, `up`, `id` and `daemon` create one.
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Print one JSON value on stdout (errors as one JSON line on stderr).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create this node's profile (its key and config) without starting it: edit the config, then `mcpmesh up`.
    #[command(
        after_help = "Examples:\n  mcpmesh init\n  mcpmesh --home ~/mesh-test init --loopback   a profile for trying things out: loopback only, no relays"
    )]
    Init {
        /// Listen on 127.0.0.1 only and use no relay servers: nothing leaves this machine.
        #[arg(long)]
        loopback: bool,
        /// What this node suggests peers call it (default: the host name).
        #[arg(long, value_name = "NAME")]
        nickname: Option<String>,
    },
    /// Show this node's endpoint id and dialable addresses (starts the node if needed).
    #[command(
        after_help = "Examples:\n  mcpmesh id\n  mcpmesh id --json\n  mcpmesh id --jwks > mcpmesh-jwks.json"
    )]
    Id {
        /// Print the node's public key as a JWKS document, for a `url` server to verify the
        /// signed caller assertions this node sends it.
        #[arg(long)]
        jwks: bool,
    },
    /// Start the node in the background.
    #[command(after_help = "Examples:\n  mcpmesh up")]
    Up,
    /// Stop the node and every server it spawned.
    #[command(after_help = "Examples:\n  mcpmesh down")]
    Down,
    /// Run the node in the foreground.
    #[command(
        after_help = "Examples:\n  mcpmesh daemon                 as a systemd user service runs it"
    )]
    Daemon {
        /// Report readiness or failure as one JSON line on stdout (for whoever started us).
        #[arg(long, hide = true)]
        notify: bool,
        /// Write the log to the profile's log file (`doctor` names it), rotated at 10 MiB
        /// (`MCPMESH_LOG_MAX_BYTES`) with 3 older files kept, instead of to stderr. A node that
        /// starts itself does this.
        #[arg(long)]
        log_file: bool,
    },
    /// List trusted peers, or add, rename or remove one.
    #[command(
        after_help = "Examples:\n  mcpmesh peers\n  mcpmesh peers add bob eid:3b6a…c2 --addr bob.lan:4433\n  mcpmesh peers rename bob bob-laptop\n  mcpmesh peers remove bob-laptop"
    )]
    Peers {
        #[command(subcommand)]
        action: Option<PeersAction>,
    },
    /// Serve an MCP server to peers: a stdio command spawned once per session
    /// (`serve NAME -- CMD…`), a long-running server on a Unix socket (`--socket PATH`), or a
    /// Streamable HTTP server (`--url URL`).
    #[command(
        after_help = "Examples:\n  mcpmesh serve notes -- npx -y @modelcontextprotocol/server-filesystem ~/notes\n  mcpmesh serve notes --allow bob -- ./notes-server --read-only\n  mcpmesh serve notes --allow group:eng --env NOTES_READONLY=1 -- ./notes-server\n  mcpmesh serve tools --socket /run/user/1000/tools.sock\n  mcpmesh serve search --url https://mcp.example.com/mcp --header 'Authorization=Bearer ${SEARCH_TOKEN}'\n  mcpmesh serve notes --replace -- npx -y @modelcontextprotocol/server-filesystem ~/notes/shared"
    )]
    Serve(ServeArgs),
    /// Stop serving a service (its live sessions end).
    #[command(after_help = "Examples:\n  mcpmesh unserve notes")]
    Unserve {
        /// The service to stop serving.
        name: String,
    },
    /// Mint a one-line invite that shares services with whoever redeems it.
    #[command(
        after_help = "Examples:\n  mcpmesh invite notes\n  mcpmesh invite notes calc --uses 3 --ttl 7d"
    )]
    Invite {
        /// The services to share.
        #[arg(required = true)]
        services: Vec<String>,
        /// How many times it may be redeemed (1 to 64).
        #[arg(long, default_value_t = 1)]
        uses: u32,
        /// How long it stays valid (e.g. 30m, 24h, 7d; at most 7d).
        #[arg(long, default_value = "24h")]
        ttl: String,
    },
    /// Redeem an invite: both nodes trust each other and you can mount the shared services.
    #[command(
        after_help = "Examples:\n  mcpmesh pair 'mcpmesh-invite:…'\n  mcpmesh pair 'mcpmesh-invite:…' --name alice-laptop\n\nAn invite wrapped over several lines or in quotes, as mail and chat deliver it, is fine."
    )]
    Pair {
        /// The `mcpmesh-invite:…` line.
        invite: String,
        /// What to call the inviter here (default: the name it suggests).
        #[arg(long)]
        name: Option<String>,
    },
    /// Join an org with the `mcpmesh-join:…` line its admin gave you: this device gets the
    /// user and groups the admin chose, and the org's members trust it.
    #[command(
        after_help = "Examples:\n  mcpmesh join 'mcpmesh-join:…'\n  mcpmesh join 'mcpmesh-join:…' --device laptop\n\nCompare the three-word code it prints with the admin's."
    )]
    Join {
        /// The `mcpmesh-join:…` line.
        invite: String,
        /// What to call this device in the roster.
        #[arg(long, value_name = "NAME")]
        device: Option<String>,
    },
    /// A team roster: users, their devices and groups, signed by the org's admin node, so
    /// `allow` lists can name `user:ID` and `group:NAME`.
    #[command(
        after_help = "Examples:\n  mcpmesh org create acme --user alice\n  mcpmesh org invite bob --groups eng\n  mcpmesh org members"
    )]
    Org {
        #[command(subcommand)]
        action: OrgAction,
    },
    /// Let a peer, a user, a group or the whole org use one of your services (with --tools,
    /// those of its tools).
    #[command(
        after_help = "Examples:\n  mcpmesh grant bob notes\n  mcpmesh grant bob files --tools 'read_*,list_*'\n  mcpmesh grant group:eng files --tools 'read_*'\n  mcpmesh grant org:acme notes"
    )]
    Grant {
        /// A peer by the name `mcpmesh peers` shows, or a principal: peer:NAME, eid:HEX,
        /// user:ID, group:NAME, org:NAME (the last three from the org roster).
        #[arg(value_name = "PRINCIPAL")]
        peer: String,
        /// One of your services.
        service: String,
        /// Tool names or globs (`*`, `?`), comma-separated, added to the principal's own rule
        /// in config.toml (placed first; denies of other rules still apply).
        #[arg(long, value_delimiter = ',', num_args = 1)]
        tools: Option<Vec<String>>,
    },
    /// Take a principal's access to a service away (live sessions it no longer admits end),
    /// or with --tools only some of its tools (the grant stays).
    #[command(
        after_help = "Examples:\n  mcpmesh revoke bob notes\n  mcpmesh revoke bob files --tools delete_file\n  mcpmesh revoke group:eng files --tools 'write_*'"
    )]
    Revoke {
        /// A peer by the name `mcpmesh peers` shows, or a principal (as for `grant`).
        #[arg(value_name = "PRINCIPAL")]
        peer: String,
        /// One of your services.
        service: String,
        /// Tool names or globs, comma-separated, the principal may no longer use there.
        #[arg(long, value_delimiter = ',', num_args = 1)]
        tools: Option<Vec<String>>,
    },
    /// Every service this node may mount: what each peer (paired, added by id, or a member of
    /// your org) answers when asked what this node may use there.
    #[command(
        after_help = "Examples:\n  mcpmesh services\n  mcpmesh services --refresh\n  mcpmesh services --json"
    )]
    Services {
        /// Ask every reachable peer now instead of answering from what they last said.
        #[arg(long)]
        refresh: bool,
    },
    /// Make the OAuth grant a `url` service's server requires (the node is its OAuth client):
    /// open the authorization URL, take the code on a loopback redirect, keep the tokens.
    #[command(
        after_help = "Examples:\n  mcpmesh auth wiki --browser firefox\n  mcpmesh auth wiki            # no browser: prints the URL to open anywhere\n  mcpmesh auth wiki --redirect-url 'http://127.0.0.1:PORT/callback?code=…&state=…'\n  mcpmesh auth wiki --status\n  mcpmesh auth wiki --logout"
    )]
    Auth {
        /// The `url` service.
        name: String,
        /// The command that opens a URL (default: $BROWSER; without either, the URL is printed
        /// and a second call with --redirect-url finishes).
        #[arg(long, value_name = "CMD", conflicts_with_all = ["redirect_url", "status", "logout"])]
        browser: Option<String>,
        /// Finish an authorization begun without a browser: the URL the browser was sent to
        /// after approving (it fails to load on a headless node; copy it from the address bar).
        #[arg(long, value_name = "URL", conflicts_with_all = ["status", "logout"])]
        redirect_url: Option<String>,
        /// Whether the service has a grant, until when, for which scopes.
        #[arg(long, conflicts_with = "logout")]
        status: bool,
        /// Forget the service's grant.
        #[arg(long)]
        logout: bool,
    },
    /// Print how to mount a peer's service in Claude Code, Claude Desktop, Cursor, VS Code;
    /// with no argument, list what can be mounted.
    #[command(
        after_help = "Examples:\n  mcpmesh use\n  mcpmesh use alice/notes\n  mcpmesh use alice/notes --json\n  mcpmesh use hub"
    )]
    Use {
        /// The peer's service, as PEER/SERVICE; or `hub`, for the hub over all of them.
        target: Option<String>,
    },
    /// What this node serves and to whom, its peers, live sessions, recent pairings.
    #[command(
        after_help = "Examples:\n  mcpmesh status\n  mcpmesh status --json\n  mcpmesh status --web"
    )]
    Status {
        /// Print the URL of the status page, a page on loopback that shows the same and updates
        /// itself (opened now if it is not yet). The URL carries the page's token: keep it to
        /// yourself.
        #[arg(long)]
        web: bool,
    },
    /// Follow the node live: sessions opening and closing, each request's latency and bytes,
    /// trust changes (with --json, one JSON event per line).
    #[command(
        after_help = "Examples:\n  mcpmesh watch\n  mcpmesh watch --json | jq 'select(.event == \"request\")'"
    )]
    Watch,
    /// Check config, key and socket permissions, service commands and network settings, and
    /// whether the configured relays and discovery servers answer.
    #[command(after_help = "Examples:\n  mcpmesh doctor\n  mcpmesh doctor --offline")]
    Doctor {
        /// Do not contact the configured relays and discovery servers.
        #[arg(long)]
        offline: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(
        after_help = "Examples:\n  mcpmesh completions bash > ~/.local/share/bash-completion/completions/mcpmesh\n  mcpmesh completions zsh > \"${fpath[1]}/_mcpmesh\""
    )]
    Completions {
        /// The shell the script is for.
        shell: clap_complete::Shell,
    },
    /// Be the stdio MCP server for a peer's service (what AI clients launch).
    #[command(
        after_help = "Examples:\n  mcpmesh connect alice/notes\n  claude mcp add alice-notes -- mcpmesh connect alice/notes"
    )]
    Connect {
        /// The peer's service, as PEER/SERVICE.
        target: String,
    },
    /// Be one stdio MCP server over many mounted services: their tools and prompts named
    /// PEER__SERVICE__NAME, lists answered from a cache, a session opened per service on
    /// first use and closed when idle (what AI clients launch).
    #[command(
        after_help = "Examples:\n  mcpmesh hub\n  mcpmesh hub alice/notes bob/files --idle 5m\n  claude mcp add mesh -- mcpmesh hub"
    )]
    Hub {
        /// The services to present, as PEER/SERVICE; none: every one this node may mount.
        targets: Vec<String>,
        /// Close a service's session after it is unused this long (30s, 5m, 1h).
        #[arg(long, value_name = "DURATION", default_value = "60s")]
        idle: String,
        /// How much of its path a tool's name carries: `prefixed` (PEER__SERVICE__TOOL),
        /// `service` or `bare` (shorter only where no two tools would share a name).
        #[arg(long, value_name = "MODE", default_value = "prefixed")]
        names: mcpmesh::hub::Naming,
    },
    /// Serve every mountable PEER/SERVICE as a Streamable HTTP MCP endpoint at
    /// http://LISTEN/mcp/PEER/SERVICE, for clients that speak HTTP (runs in the foreground).
    /// Every request must carry this node's gateway token (`Authorization: Bearer …`; `mcpmesh
    /// use PEER/SERVICE` prints it). Beyond loopback it serves HTTPS only (--tls-cert,
    /// --tls-key), so the token never crosses the network in the clear.
    #[command(
        after_help = "Examples:\n  mcpmesh gateway\n  mcpmesh gateway --listen 127.0.0.1:9000 --allow-origin https://app.example\n  mcpmesh gateway --listen 0.0.0.0:8484 --allow-remote --tls-cert cert.pem --tls-key key.pem"
    )]
    Gateway(GatewayArgs),
    /// Read the audit log: recent records, totals, or a check of its integrity.
    #[command(
        after_help = "Examples:\n  mcpmesh audit tail -n 50 --peer bob\n  mcpmesh audit summary --since 24h\n  mcpmesh audit verify"
    )]
    Audit {
        #[command(subcommand)]
        action: AuditAction,
    },
    /// Two nodes on this machine share a tool, end to end: no network, no accounts.
    #[command(after_help = "Examples:\n  mcpmesh demo")]
    Demo,
    /// The demo's built-in stdio MCP server.
    #[command(hide = true)]
    DemoServer,
}

/// `serve`'s arguments: the service, who may use it, and what it is attached to.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The service's name, as peers will mount it (`<this node>/<NAME>`).
    pub name: String,
    /// Who may use it: a peer name (`NAME` or `peer:NAME`) or a key (`eid:<hex>`);
    /// `user:ID`, `group:NAME` and `org:NAME` match members of a team roster. Repeatable.
    #[arg(long = "allow", value_name = "PRINCIPAL")]
    pub allow: Vec<String>,
    /// Sessions running at once (default 4).
    #[arg(long, value_name = "N")]
    pub max_sessions: Option<u32>,
    /// What the service is for, in one line: the peers it admits see it in their
    /// `mcpmesh services`.
    #[arg(long, value_name = "TEXT")]
    pub description: Option<String>,
    /// Replace the command, socket or URL of a service that already exists; its grants
    /// stay (the answer says who keeps access).
    #[arg(long)]
    pub replace: bool,
    /// A Unix socket a running MCP server listens on; one connection per session, the
    /// caller's identity in each request's `params._meta["mcpmesh/peer"]`.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["cmd", "url"])]
    pub socket: Option<PathBuf>,
    /// A Streamable HTTP MCP server (http:// or https://); one upstream session per mesh
    /// session, the caller's identity in each request's `_meta` as for `--socket`.
    #[arg(long, value_name = "URL", conflicts_with = "cmd")]
    pub url: Option<String>,
    /// A header sent to `--url`, as NAME=VALUE; `${VAR}` in VALUE is read from the node's
    /// environment when a session starts (for tokens). Repeatable.
    #[arg(long = "header", value_name = "NAME=VALUE", requires = "url")]
    pub headers: Vec<String>,
    /// The header `--url` gets the signed caller assertion in (default Mcpmesh-Caller);
    /// the server verifies it against `mcpmesh id --jwks`.
    #[arg(long, value_name = "NAME", requires = "url")]
    pub caller_header: Option<String>,
    /// The server requires an OAuth grant: sessions send the one `mcpmesh auth NAME` makes
    /// (and without it are answered -32056 saying so).
    #[arg(long, requires = "url")]
    pub oauth: bool,
    /// With --oauth: a client registered beforehand with the server's authorization
    /// server (otherwise a Client ID Metadata Document or dynamic registration).
    #[arg(long, value_name = "ID", requires = "url")]
    pub client_id: Option<String>,
    /// With --client-id: a file holding that client's secret (kept in config.toml, 0600).
    #[arg(long, value_name = "PATH", requires = "client_id")]
    pub client_secret_file: Option<PathBuf>,
    /// With --oauth: the https:// URL of a Client ID Metadata Document you serve, used
    /// as the client id where the authorization server takes one.
    #[arg(long, value_name = "URL", requires = "url")]
    pub client_metadata_url: Option<String>,
    /// With --oauth: a scope to ask for (otherwise the server's challenge or metadata
    /// decides). Repeatable.
    #[arg(long = "scope", value_name = "SCOPE", requires = "url")]
    pub scopes: Vec<String>,
    /// With --client-id and --client-secret-file: the node acts for itself, with the
    /// client-credentials grant (`mcpmesh auth NAME` needs no browser, and the node asks
    /// for a new token whenever one lapses).
    #[arg(long, requires = "client_id")]
    pub client_credentials: bool,
    /// With --client-credentials: a PKCS#8 PEM private key (P-256 or Ed25519, mode 0600)
    /// the client authenticates with (`private_key_jwt`) instead of a secret; the file
    /// stays where it is and is read at each token request.
    #[arg(
        long,
        value_name = "PATH",
        requires = "client_credentials",
        conflicts_with = "client_secret_file"
    )]
    pub client_key_file: Option<PathBuf>,
    /// Send `--url` no signed caller assertion (it still gets `_meta`).
    #[arg(long, requires = "url", conflicts_with = "caller_header")]
    pub no_caller_assertion: bool,
    /// Give `--socket` the signed caller assertion too, in each request's
    /// `params._meta["mcpmesh/caller"]`, for a server that verifies rather than trusts.
    #[arg(long, requires = "socket")]
    pub caller_assertion: bool,
    /// An environment variable for the server command, as KEY=VALUE (kept in config.toml;
    /// other variables of a service that exists stay). Repeatable.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// The server command and its arguments.
    #[arg(last = true, required_unless_present_any = ["socket", "url"], value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// `gateway`'s arguments: where it listens, and what a request must carry to be let in.
#[derive(Debug, Args)]
pub struct GatewayArgs {
    /// Where to listen: loopback unless --allow-remote.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8484")]
    pub listen: std::net::SocketAddr,
    /// Allow a non-loopback address (never with --no-token; needs --tls-cert and --tls-key).
    #[arg(long)]
    pub allow_remote: bool,
    /// Serve HTTPS with this certificate chain (PEM, leaf first); required beyond
    /// loopback.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// The bearer token clients must send, instead of this node's own (minted once and
    /// kept in the profile); read from MCPMESH_GATEWAY_TOKEN when not given, to keep it
    /// out of process listings.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "MCPMESH_GATEWAY_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Serve on loopback without a token: every local user can then act as this node
    /// through the gateway.
    #[arg(long, conflicts_with = "token")]
    pub no_token: bool,
    /// An Origin browsers may call from besides loopback ones (e.g. https://app.example).
    /// Repeatable.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// A Host name accepted besides loopback names (for a loopback bind reached through a
    /// local proxy). Repeatable.
    #[arg(long = "allow-host", value_name = "NAME")]
    pub allowed_hosts: Vec<String>,
    /// End a session after this long with no request in flight and no open stream (clients
    /// that go away without DELETE): 90s, 5m, 1h (a bare number is seconds).
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub idle: String,
}

#[derive(Debug, Subcommand)]
pub enum AuditAction {
    /// The most recent records (with --json, one JSON record per line).
    #[command(
        after_help = "Examples:\n  mcpmesh audit tail\n  mcpmesh audit tail -f --service notes"
    )]
    Tail {
        /// How many records.
        #[arg(short = 'n', long = "lines", default_value_t = 20)]
        lines: usize,
        /// Keep printing records as they are written.
        #[arg(long, short)]
        follow: bool,
        /// Only records about this peer.
        #[arg(long)]
        peer: Option<String>,
        /// Only records about this service.
        #[arg(long)]
        service: Option<String>,
    },
    /// Check the hash chain; exits 1 if any record was edited, removed, inserted or moved.
    #[command(after_help = "Examples:\n  mcpmesh audit verify")]
    Verify,
    /// Sessions, requests, errors, latency and bytes per peer and per service.
    #[command(
        after_help = "Examples:\n  mcpmesh audit summary\n  mcpmesh audit summary --since 7d"
    )]
    Summary {
        /// Only records this recent (30m, 24h, 7d).
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum OrgAction {
    /// Start an org with this node as its admin: a new root key signs the roster.
    #[command(
        after_help = "Examples:\n  mcpmesh org create acme\n  mcpmesh org create acme --user alice\n\nBack up the root key afterwards: mcpmesh org export-root FILE"
    )]
    Create {
        /// The org's name.
        name: String,
        /// Your user id in it (default: this node's nickname, else `admin`).
        #[arg(long, value_name = "ID")]
        user: Option<String>,
    },
    /// Mint a one-line join invite for a user's device (admin only).
    ///
    /// The line alone goes to stdout, so it can be piped; the notes go to stderr.
    #[command(
        after_help = "Examples:\n  mcpmesh org invite bob\n  mcpmesh org invite bob --groups eng,ops --device laptop --ttl 7d\n  mcpmesh org invite bob --device laptop --readmit\n  mcpmesh org invite bob | mail -s 'join acme' bob@example.org"
    )]
    Invite {
        /// The user the device joins as.
        user: String,
        /// The user's groups, comma-separated.
        #[arg(long, value_name = "G1,G2")]
        groups: Option<String>,
        /// What to call the device in the roster.
        #[arg(long, value_name = "NAME")]
        device: Option<String>,
        /// How long it stays valid (e.g. 30m, 24h, 7d; at most 7d).
        #[arg(long, default_value = "24h")]
        ttl: String,
        /// Let the removed device NAME join again with its old key (signs a roster that no
        /// longer revokes it); without it, a removed device joins only with a new key.
        #[arg(long, requires = "device")]
        readmit: bool,
    },
    /// The roster: every user, their groups and devices, and the revoked keys.
    #[command(after_help = "Examples:\n  mcpmesh org members\n  mcpmesh org members --json")]
    Members,
    /// Take a user, or one of their devices, out of the roster (admin only).
    ///
    /// The keys removed are revoked and their connections end.
    #[command(
        after_help = "Examples:\n  mcpmesh org remove bob\n  mcpmesh org remove bob --device old-laptop"
    )]
    Remove {
        /// The user.
        user: String,
        /// Only this device of theirs.
        #[arg(long, value_name = "NAME")]
        device: Option<String>,
    },
    /// Set a user's groups (admin only), replacing the ones they had.
    #[command(
        after_help = "Examples:\n  mcpmesh org groups bob eng,ops\n  mcpmesh org groups bob ''      no groups at all"
    )]
    Groups {
        /// The user.
        user: String,
        /// The groups, comma-separated; an empty string clears them.
        #[arg(value_name = "G1,G2")]
        groups: String,
    },
    /// The roster this node holds and each member device: reachable or not, and its serial.
    #[command(after_help = "Examples:\n  mcpmesh org status\n  mcpmesh org status --json")]
    Status,
    /// Back up the org's root key and roster to FILE (admin only).
    ///
    /// The file is created 0600 and an existing one is never overwritten. Keep it offline, or
    /// use it to move the admin to another machine.
    #[command(after_help = "Examples:\n  mcpmesh org export-root /media/usb/acme-root.json")]
    ExportRoot {
        /// The file to create.
        file: PathBuf,
    },
    /// Make this node the org's admin from a file `org export-root` wrote.
    #[command(
        after_help = "Examples:\n  mcpmesh org import-root /media/usb/acme-root.json\n  mcpmesh org import-root acme-root.json --user alice"
    )]
    ImportRoot {
        /// The file `org export-root` wrote.
        file: PathBuf,
        /// Your user id in the org.
        #[arg(long, value_name = "ID")]
        user: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum PeersAction {
    /// Trust a peer by its endpoint id (static trust, no ceremony).
    #[command(
        after_help = "Examples:\n  mcpmesh peers add bob eid:3b6a…c2 --addr 192.0.2.7:4433\n  mcpmesh peers add bob 3b6a…c2 --addr bob.lan:4433\n\nThe id is what `mcpmesh id` prints on the peer's machine, with or without `eid:`."
    )]
    Add {
        /// What to call the peer here.
        name: String,
        /// The peer's endpoint id: 64 hex digits, with or without `eid:`.
        id: String,
        /// An address the peer can be reached at: IP:PORT, or HOST:PORT (resolved now).
        /// Repeatable.
        #[arg(long = "addr", value_name = "HOST:PORT")]
        addrs: Vec<String>,
    },
    /// Give a peer another name (its grants follow).
    #[command(after_help = "Examples:\n  mcpmesh peers rename bob bob-laptop")]
    Rename {
        /// The peer's current name.
        old: String,
        /// Its new name.
        new: String,
    },
    /// Stop trusting a peer: its grants go and its live connections end at once.
    #[command(after_help = "Examples:\n  mcpmesh peers remove bob")]
    Remove {
        /// The peer's name.
        name: String,
    },
}

/// Whether the command line asks for `--json` (before any `--`), so that even a command
/// line clap refuses is answered in JSON.
pub fn wants_json(args: &[std::ffi::OsString]) -> bool {
    args.iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "--json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every visible verb has an example, and every argument of it a description.
    #[test]
    fn every_verb_has_an_example_and_every_argument_a_description() {
        fn walk(cmd: &clap::Command, path: &str) {
            for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
                let path = format!("{path} {}", sub.get_name());
                if sub.get_name() != "help" && !sub.has_subcommands() {
                    let after = sub.get_after_help().map(|h| h.to_string());
                    assert!(
                        after.is_some_and(|h| h.contains("Examples:\n  mcpmesh ")),
                        "{path} has no example"
                    );
                }
                for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
                    assert!(
                        arg.get_help().is_some(),
                        "{path}: {} has no description",
                        arg.get_id()
                    );
                }
                walk(sub, &path);
            }
        }
        walk(&Cli::command(), "mcpmesh");
    }

    #[test]
    fn json_is_seen_anywhere_before_a_double_dash() {
        let args = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert!(wants_json(&args(&["mcpmesh", "peers", "add", "--json"])));
        assert!(!wants_json(&args(&[
            "mcpmesh", "serve", "x", "--", "srv", "--json"
        ])));
    }
}

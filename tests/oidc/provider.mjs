// A real OpenID Connect provider for llmgw's single sign-on tests: the certified `oidc-provider`
// package, configured from a JSON file the test writes (llmgw/testing/oidcprovider.py starts it).
//
//   node provider.mjs CONFIG.json
//
// CONFIG: {"issuer": "http://127.0.0.1:PORT", "port": PORT, "clients": [...], "jwks": {"keys": [private JWK]},
//          "accounts_file": "accounts.json", "cookie_keys": ["..."], "ttl": {...optional seconds}}
// accounts.json: {"alice": {"email": "...", "name": "...", "groups": ["llmgw-admins"]}, ...}, read on EVERY
// lookup, so a test that removes a user's group (or the user) sees it at the next refresh.
//
// The provider's own pages (devInteractions) log a user in and ask for consent: the login page takes
// any password (a test provider), and a name that is not in accounts.json gets no tokens.
// One test-only route: POST /_harness/revoke {"account": "alice"} ends every grant of that account
// (what an identity provider's administrator does when a user's session is ended): its refresh
// tokens stop working at once.
import fs from 'node:fs';
import http from 'node:http';
import Provider from 'oidc-provider';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));

function accounts() {
  return JSON.parse(fs.readFileSync(config.accounts_file, 'utf8'));
}

// grantId by account, to end an account's grants on request.
const grantsOf = new Map();
const base = (await import('oidc-provider/lib/adapters/memory_adapter.js')).default;
class Adapter extends base {
  async upsert(id, payload, expiresIn) {
    if (this.model === 'Grant' && payload.accountId) {
      if (!grantsOf.has(payload.accountId)) grantsOf.set(payload.accountId, new Set());
      grantsOf.get(payload.accountId).add(id);
    }
    return super.upsert(id, payload, expiresIn);
  }
}

const ttl = config.ttl || {};
const provider = new Provider(config.issuer, {
  adapter: Adapter,
  clients: config.clients,
  jwks: config.jwks,
  cookies: { keys: config.cookie_keys },
  scopes: ['openid', 'profile', 'email', 'groups', 'offline_access'],
  claims: {
    openid: ['sub'],
    profile: ['name', 'preferred_username'],
    email: ['email', 'email_verified'],
    groups: ['groups'],
  },
  // The scopes' claims in the ID token too (llmgw reads groups from it), not only at userinfo.
  conformIdTokenClaims: false,
  features: {
    devInteractions: { enabled: true },
    deviceFlow: { enabled: true },
    revocation: { enabled: true },
    introspection: { enabled: true },
  },
  pkce: { required: () => true },
  // A refresh token for every client allowed the grant (llmgw refreshes to notice a removed group).
  issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
  ttl: {
    AccessToken: ttl.access_token || 600,
    IdToken: ttl.id_token || 600,
    DeviceCode: ttl.device_code || 600,
    RefreshToken: ttl.refresh_token || 86400,
    Interaction: 3600,
    Session: 86400,
    Grant: 86400,
  },
  async findAccount(ctx, id) {
    const account = accounts()[id];
    if (!account) return undefined;
    return {
      accountId: id,
      async claims() {
        const now = accounts()[id] || {};  // read again: a group removed since the login shows
        return {
          sub: id,
          name: now.name || id,
          preferred_username: id,
          email: now.email || `${id}@example.test`,
          email_verified: true,
          groups: now.groups || [],
        };
      },
    };
  },
});
provider.proxy = false;

// The harness's one route of its own (see the top).
provider.use(async (ctx, next) => {
  if (ctx.method === 'POST' && ctx.path === '/_harness/revoke') {
    const body = await new Promise((resolve) => {
      let text = '';
      ctx.req.on('data', (c) => { text += c; });
      ctx.req.on('end', () => resolve(text));
    });
    const { account } = JSON.parse(body || '{}');
    let ended = 0;
    for (const grantId of grantsOf.get(account) || []) {
      const grant = await provider.Grant.find(grantId);
      if (grant) { await grant.destroy(); ended += 1; }
      await new Adapter('RefreshToken').revokeByGrantId(grantId);
    }
    grantsOf.delete(account);
    ctx.body = { ended };
    return;
  }
  await next();
});

const server = http.createServer(provider.callback());
server.listen(config.port, '127.0.0.1', () => {
  process.stdout.write(`oidc provider ${config.issuer} ready\n`);
});
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => server.close(() => process.exit(0)));

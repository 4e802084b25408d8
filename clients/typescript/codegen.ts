import type { CodegenConfig } from '@graphql-codegen/cli';

// Types for the operations in src/ from the schema as served. src/gql/ is
// generated (and git-ignored): `npm run check` regenerates it, then tsc
// checks src/ against it.
const config: CodegenConfig = {
  schema: '../../schema.graphql',
  documents: ['src/**/*.ts', '!src/gql/**/*'],
  ignoreNoDocuments: false,
  generates: {
    './src/gql/': {
      preset: 'client',
      config: {
        scalars: { UUID: 'string', DateTime: 'string' },
        strictScalars: true,
      },
    },
  },
};

export default config;

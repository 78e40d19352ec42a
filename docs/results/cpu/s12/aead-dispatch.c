/* Session 12 probe: the EVP path against calling the default provider's GCM functions directly
 * (OSSL_PROVIDER_query_operation), 1448-byte datagrams, and one bulk 1 MiB update for scale.
 * gcc -O2 aead-dispatch.c -o /tmp/aead-dispatch -lcrypto && /tmp/aead-dispatch */
#include <openssl/evp.h>
#include <openssl/core.h>
#include <openssl/core_dispatch.h>
#include <openssl/core_names.h>
#include <openssl/provider.h>
#include <openssl/params.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#define N 200000
#define SZ 1448
static double now(){struct timespec t;clock_gettime(CLOCK_PROCESS_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint8_t buf[SZ+64], hdr[24], key[32], iv[12];
int main(){
  EVP_CIPHER_CTX *c=EVP_CIPHER_CTX_new(); int outl;
  EVP_EncryptInit_ex(c,EVP_aes_256_gcm(),NULL,NULL,NULL);
  EVP_CIPHER_CTX_ctrl(c,EVP_CTRL_AEAD_SET_IVLEN,12,NULL);
  EVP_EncryptInit_ex(c,NULL,NULL,key,NULL);
  double t=now();
  for(int i=0;i<N;i++){ iv[11]=i; EVP_EncryptInit_ex(c,NULL,NULL,NULL,iv); EVP_EncryptUpdate(c,NULL,&outl,hdr,24);
    EVP_EncryptUpdate(c,buf,&outl,buf,SZ); EVP_EncryptFinal_ex(c,buf+SZ,&outl); EVP_CIPHER_CTX_ctrl(c,EVP_CTRL_AEAD_GET_TAG,16,buf+SZ);}
  double a=now()-t; printf("evp       %.3f CPU-s/GB\n", a/(N*(double)SZ)*1e9);
  /* direct provider dispatch */
  OSSL_PROVIDER *prov=OSSL_PROVIDER_load(NULL,"default"); int nc;
  const OSSL_ALGORITHM *alg=OSSL_PROVIDER_query_operation(prov,OSSL_OP_CIPHER,&nc);
  const OSSL_DISPATCH *d=NULL;
  for(;alg->algorithm_names;alg++) if(strstr(alg->algorithm_names,"AES-256-GCM")){d=alg->implementation;break;}
  OSSL_FUNC_cipher_newctx_fn *newctx=0; OSSL_FUNC_cipher_encrypt_init_fn *einit=0; OSSL_FUNC_cipher_update_fn *upd=0; OSSL_FUNC_cipher_final_fn *fin=0; OSSL_FUNC_cipher_get_ctx_params_fn *gp=0;
  for(;d->function_id;d++){switch(d->function_id){case OSSL_FUNC_CIPHER_NEWCTX:newctx=(void*)d->function;break;case OSSL_FUNC_CIPHER_ENCRYPT_INIT:einit=(void*)d->function;break;case OSSL_FUNC_CIPHER_UPDATE:upd=(void*)d->function;break;case OSSL_FUNC_CIPHER_FINAL:fin=(void*)d->function;break;case OSSL_FUNC_CIPHER_GET_CTX_PARAMS:gp=(void*)d->function;break;}}
  void *pc=OSSL_PROVIDER_get0_provider_ctx(prov); void *ac=newctx(pc);
  einit(ac,key,32,iv,12,NULL);
  uint8_t tag[16]; OSSL_PARAM ps[2]={OSSL_PARAM_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG,tag,16),OSSL_PARAM_END};
  size_t o;
  t=now();
  for(int i=0;i<N;i++){ iv[11]=i; einit(ac,NULL,0,iv,12,NULL); upd(ac,NULL,&o,0,hdr,24); upd(ac,buf,&o,SZ,buf,SZ); fin(ac,buf+SZ,&o,0); gp(ac,ps);}
  double b=now()-t; printf("dispatch  %.3f CPU-s/GB\n", b/(N*(double)SZ)*1e9);
  static uint8_t big[1<<20]; t=now();
  for(int i=0;i<N*SZ/(1<<20);i++){ einit(ac,NULL,0,iv,12,NULL); upd(ac,big,&o,1<<20,big,1<<20);}
  double e=now()-t; printf("bulk      %.3f CPU-s/GB\n", e/((N*SZ/(1<<20))*(double)(1<<20))*1e9);
}
